//~ The batched loop's loads under the first branch (reviewed template; rendered by
//~ `shapes::grid_stride`): its predicate ({{prefix}}, the body's lines before the branch, all
//~ `const` values of the loads above, and {{open}}, the line opening the branch) decides which of {{loads}} are
//~ issued, still before the first use.
        // Loads needed only where the predicate holds: issued for all the elements before the first use.
        #pragma unroll
        for (int kf_u = 0; kf_u < {{batch}}; ++kf_u) {
            const kf_index i = kf_i0 + kf_u * kf_stride + (kf_index)((threadIdx.x + kf_rot + 32u * kf_u) % {{block}}u);
            if (i < n) {
{{prefix}}
{{open}}
{{loads}}
                }
            }
        }
