//~ The rows plan: the zero fill of output {{o}} ({{name}}) over the padding of a tile's elements
//~ [kf_za, kf_zb), for 16-byte elements (one per chunk: a streaming store per padding element).
//~ Fill thread kf_ft takes every kf_fn-th element. (Reviewed template; rendered by
//~ `shapes::rows`.)
            if (kf_a{{o}}) { // {{name}}: zero where the mask fails; chunk k of a row holds its columns [1 k, 1 k + 1)
                uint4* kf_zp = reinterpret_cast<uint4*>(out{{o}}) + kf_za / 1;
                const int kf_zn = (int)(kf_r1 - kf_r0) * kf_cp{{o}};
                int kf_kr = kf_ft / kf_cp{{o}}, kf_kc = kf_ft - kf_kr * kf_cp{{o}}; // this thread's chunk: row in the tile, chunk in the row
                for (int kf_q = kf_ft; kf_q < kf_zn; kf_q += kf_fn) {
                    const int kf_k0 = kf_kc, kf_hb = kf_hf[kf_kr]; // the chunk's first column, the row's bound
                    if (kf_k0 >= kf_hb) kf_st_cs(kf_zp + kf_q, {{zero16}});
                    kf_kc += kf_ep{{o}};
                    kf_kr += kf_dp{{o}};
                    if (kf_kc >= kf_cp{{o}}) { kf_kc -= kf_cp{{o}}; ++kf_kr; }
                }
            } else {
                const long long kf_d{{o}} = (long long)kf_fn * 1 / cols, kf_e{{o}} = (long long)kf_fn * 1 - kf_d{{o}} * cols; // a step of kf_fn chunks: rows, columns
                const long long kf_zc = (kf_za + 0) / 1, kf_zd = kf_zb / 1; // whole 16-byte chunks [kf_zc, kf_zd), some across rows
                long long kf_kr = ((kf_zc + kf_ft) * 1 - kf_za) / cols, kf_kc = (kf_zc + kf_ft) * 1 - kf_za - kf_kr * cols; // the chunk's first element: row, column in the tile
                for (long long kf_q = kf_zc + kf_ft; kf_q < kf_zd; kf_q += kf_fn) {
                    const long long kf_hb = kf_hf[kf_kr];
                    if (kf_kc >= kf_hb) kf_st_cs(reinterpret_cast<uint4*>(out{{o}}) + kf_q, {{zero16}});
                    kf_kc += kf_e{{o}};
                    kf_kr += kf_d{{o}};
                    if (kf_kc >= cols) { kf_kc -= cols; ++kf_kr; }
                }
            }
