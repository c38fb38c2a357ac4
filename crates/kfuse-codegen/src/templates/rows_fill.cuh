//~ The rows plan: the zero fill of output {{o}} ({{name}}) over the padding of a tile's elements
//~ [kf_za, kf_zb), for elements smaller than 16 bytes ({{per}} per chunk, of C type {{ety}}, zero
//~ {{zero}}; {{per_m1}} is {{per}} - 1). Fill thread kf_ft takes every kf_fn-th chunk: a
//~ streaming store where the whole chunk is padding of one row, element stores of its padding where
//~ it holds a valid element or crosses a row; element stores at the range's partial ends.
//~ (Reviewed template; rendered by `shapes::rows`.)
            if (kf_a{{o}}) { // {{name}}: zero where the mask fails; chunk k of a row holds its columns [{{per}} k, {{per}} k + {{per}})
                uint4* kf_zp = reinterpret_cast<uint4*>(out{{o}}) + kf_za / {{per}};
                const int kf_zn = (int)(kf_r1 - kf_r0) * kf_cp{{o}};
                int kf_kr = kf_ft / kf_cp{{o}}, kf_kc = kf_ft - kf_kr * kf_cp{{o}}; // this thread's chunk: row in the tile, chunk in the row
                for (int kf_q = kf_ft; kf_q < kf_zn; kf_q += kf_fn) {
                    const int kf_k0 = kf_kc * {{per}}, kf_hb = kf_hf[kf_kr]; // the chunk's first column, the row's bound
                    if (kf_k0 >= kf_hb) kf_st_cs(kf_zp + kf_q, {{zero16}});
                    else if (kf_k0 + {{per}} > kf_hb) for (int j = kf_hb - kf_k0; j < {{per}}; ++j) reinterpret_cast<{{ety}}*>(kf_zp + kf_q)[j] = {{zero}}; // the row's last valid chunk
                    kf_kc += kf_ep{{o}};
                    kf_kr += kf_dp{{o}};
                    if (kf_kc >= kf_cp{{o}}) { kf_kc -= kf_cp{{o}}; ++kf_kr; }
                }
            } else {
                const long long kf_d{{o}} = (long long)kf_fn * {{per}} / cols, kf_e{{o}} = (long long)kf_fn * {{per}} - kf_d{{o}} * cols; // a step of kf_fn chunks: rows, columns
                const long long kf_zc = (kf_za + {{per_m1}}) / {{per}}, kf_zd = kf_zb / {{per}}; // whole 16-byte chunks [kf_zc, kf_zd), some across rows
                auto kf_z = [&](long long e) { const long long r = (e - kf_za) / cols; if (e - kf_za - r * cols >= kf_hf[r]) reinterpret_cast<{{ety}}*>(out{{o}})[e] = {{zero}}; };
                const long long kf_zh = kf_zc * {{per}} < kf_zb ? kf_zc * {{per}} : kf_zb, kf_zt = kf_zd * {{per}} > kf_zh ? kf_zd * {{per}} : kf_zh; // partial ends [kf_za, kf_zh), [kf_zt, kf_zb)
                for (long long e = kf_za + kf_ft; e < kf_zh; e += kf_fn) kf_z(e);
                for (long long e = kf_zt + kf_ft; e < kf_zb; e += kf_fn) kf_z(e);
                long long kf_kr = ((kf_zc + kf_ft) * {{per}} - kf_za) / cols, kf_kc = (kf_zc + kf_ft) * {{per}} - kf_za - kf_kr * cols; // the chunk's first element: row, column in the tile
                for (long long kf_q = kf_zc + kf_ft; kf_q < kf_zd; kf_q += kf_fn) {
                    const long long kf_hb = kf_hf[kf_kr];
                    if (kf_kc >= kf_hb && kf_kc + {{per}} <= cols) kf_st_cs(reinterpret_cast<uint4*>(out{{o}}) + kf_q, {{zero16}});
                    else if (kf_kc + {{per}} > kf_hb) for (int j = 0; j < {{per}}; ++j) kf_z(kf_q * {{per}} + j);
                    kf_kc += kf_e{{o}};
                    kf_kr += kf_d{{o}};
                    if (kf_kc >= cols) { kf_kc -= cols; ++kf_kr; }
                }
            }
