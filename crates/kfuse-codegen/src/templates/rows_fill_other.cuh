//~ The rows plan: else-branch stores that are not zero fills, per padding element of a tile
//~ (reviewed template; rendered by `shapes::rows`). {{stores}}: the stores of element i.
            for (long long e = kf_ft; e < kf_zb - kf_za; e += kf_fn) { // other else-branch stores, per element
                const long long kf_kr = e / cols;
                if (e - kf_kr * cols < kf_hf[kf_kr]) continue;
                const long long i = kf_za + e;
{{stores}}
            }
