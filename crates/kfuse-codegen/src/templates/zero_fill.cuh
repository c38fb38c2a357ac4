//~ Row mode: the zero fill of output {{o}} ({{name}}) over the row's columns [kf_hi, {{cols}}),
//~ for elements smaller than 16 bytes ({{per}} per chunk, C type {{ety}}, zero {{zero}};
//~ {{per_m1}} is {{per}} - 1): element stores for the partial 16-byte chunks at either end,
//~ 16-byte streaming stores between; the row's lanes take every {{stride}}-th store. Lines are
//~ relative to the row body (reviewed template; rendered by `fill`). `//~` lines are not emitted.
{ // zero fill of {{name}} over columns [kf_hi, {{cols}}): 16-byte streaming stores
    const long long kf_za = rowbase + kf_hi, kf_zb = rowbase + {{cols}}; // elements
    const long long kf_zc = (kf_za + {{per_m1}}) / {{per}}, kf_zd = kf_zb / {{per}}; // whole 16-byte chunks [kf_zc, kf_zd)
    const long long kf_zh = kf_zc * {{per}} < kf_zb ? kf_zc * {{per}} : kf_zb; // head elements [kf_za, kf_zh)
    const long long kf_zt = kf_zd * {{per}} > kf_zh ? kf_zd * {{per}} : kf_zh; // tail elements [kf_zt, kf_zb)
    for (long long e = kf_za + lane; e < kf_zh; e += {{stride}}) reinterpret_cast<{{ety}}*>(out{{o}})[e] = {{zero}};
    for (long long e = kf_zt + lane; e < kf_zb; e += {{stride}}) reinterpret_cast<{{ety}}*>(out{{o}})[e] = {{zero}};
    #pragma unroll 4
    for (long long c = kf_zc + lane; c < kf_zd; c += {{stride}}) kf_st_cs(reinterpret_cast<uint4*>(out{{o}}) + c, {{zero16}});
}
