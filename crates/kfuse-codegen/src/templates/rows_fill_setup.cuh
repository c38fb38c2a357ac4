//~ The rows plan: a zero-filled output's chunk geometry, once per kernel (reviewed template;
//~ rendered by `shapes::rows`). {{o}}: the output's number, {{name}}: its name, {{per}}: its
//~ elements per 16-byte chunk.
        // {{name}}: rows of whole 16-byte chunks (and a tile's chunks counted in 32 bits), or the general form
        const bool kf_a{{o}} = cols % {{per}} == 0 && cols / {{per}} < (1ll << 24);
        const int kf_cp{{o}} = kf_a{{o}} ? (int)(cols / {{per}}) : 1, kf_dp{{o}} = kf_fn / kf_cp{{o}}, kf_ep{{o}} = kf_fn - kf_dp{{o}} * kf_cp{{o}}; // chunks per row; a step of kf_fn chunks: rows, chunks
