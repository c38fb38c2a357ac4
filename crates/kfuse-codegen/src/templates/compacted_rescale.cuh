//~ The compacted shape after its grid barrier (reviewed template; rendered by
//~ `shapes::compacted`): the block writes out[index] = s * h for the entries of its own list
//~ (shared memory, then its global segment), with the scale s (kf_scale) that every block computed
//~ past the barrier. {{scale}}: the scale's node; {{comps}}: values per entry; generated blocks:
//~ {{shared_loads}}, {{global_loads}} (kf_h[k] of entry kf_j, resp. j) and {{store}} (the
//~ output's store of element i from kf_s * kf_h[k]). Lines starting with `//~` are not emitted.
    // After the barrier: the scale n{{scale}} is final; each block rescales the entries it listed.
    const float kf_s = kf_scale;
    for (int kf_j = threadIdx.x; kf_j < kf_ln; kf_j += blockDim.x) {
        long long i;
        float kf_h[{{comps}}];
        if (kf_j < KF_LCAP) {
            i = kf_li[kf_j];
{{shared_loads}}
        } else {
            const long long j = kf_list_base + (kf_j - KF_LCAP);
            i = (long long)list_index[j];
{{global_loads}}
        }
{{store}}
    }
