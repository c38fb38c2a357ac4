//~ Row mode: the zero fill of output {{o}} ({{name}}) over the row's columns [kf_hi, {{cols}}),
//~ for 16-byte elements: a streaming store each; the row's lanes take every {{stride}}-th store.
//~ Lines are relative to the row body (reviewed template; rendered by `fill`).
{ // zero fill of {{name}} over columns [kf_hi, {{cols}}): 16-byte streaming stores
    const long long kf_za = rowbase + kf_hi, kf_zb = rowbase + {{cols}}; // elements
    #pragma unroll 4
    for (long long e = kf_za + lane; e < kf_zb; e += {{stride}}) kf_st_cs(reinterpret_cast<uint4*>(out{{o}}) + e, {{zero16}});
}
