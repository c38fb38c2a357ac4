//! The counter-based random numbers of [`crate::Op::Rand`]: Philox-4x32-10 (Salmon et al.,
//! "Parallel random numbers: as easy as 1, 2, 3", SC 2011; the generator of Random123, cuRAND and
//! PyTorch's CUDA random ops), written once here for the interpreter and once in CUDA by the code
//! generator, which must give the same bits.
//!
//! The recipe of `rand_like(x, seed)` at the element of flat row-major index `i` of `x`'s shape:
//! - key words: `k0` = the low 32 bits of `seed` (as a two's-complement `u64`), `k1` = the high 32;
//! - counter words: `c0` = the low 32 bits of `i`, `c1` = the high 32, `c2 = c3 = 0`;
//! - ten Philox rounds (multipliers `0xD2511F53`, `0xCD9E8D57`; the key bumped by `0x9E3779B9`,
//!   `0xBB67AE85` between rounds);
//! - the value is output word 0's top 24 bits times 2^-24: a multiple of 2^-24 in `[0, 1)`,
//!   exact in `f32`.

/// The first round multiplier.
pub const M0: u32 = 0xD251_1F53;
/// The second round multiplier.
pub const M1: u32 = 0xCD9E_8D57;
/// The first key bump (the golden ratio's fraction).
pub const W0: u32 = 0x9E37_79B9;
/// The second key bump (the fraction of the square root of 3, less one).
pub const W1: u32 = 0xBB67_AE85;

/// Philox-4x32 with ten rounds of `counter` under `key` (Random123's `philox4x32_R(10, ...)`).
pub fn philox4x32_10(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let (mut c, mut k) = (counter, key);
    for round in 0..10 {
        if round > 0 {
            k = [k[0].wrapping_add(W0), k[1].wrapping_add(W1)];
        }
        let p0 = u64::from(M0) * u64::from(c[0]);
        let p1 = u64::from(M1) * u64::from(c[2]);
        let (hi0, lo0) = ((p0 >> 32) as u32, p0 as u32);
        let (hi1, lo1) = ((p1 >> 32) as u32, p1 as u32);
        c = [hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0];
    }
    c
}

/// The value of `rand_like` keyed by `seed` at flat index `index` (see the module docs).
pub fn uniform(seed: i64, index: u64) -> f32 {
    let s = seed as u64;
    let w = philox4x32_10([index as u32, (index >> 32) as u32, 0, 0], [s as u32, (s >> 32) as u32]);
    (w[0] >> 8) as f32 * (1.0 / 16_777_216.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Random123's known-answer vectors for philox4x32-10 (its `kat_vectors` file).
    #[test]
    fn known_answers() {
        let cases = [
            ([0u32; 4], [0u32; 2], [0x6627_e8d5, 0xe169_c58d, 0xbc57_ac4c, 0x9b00_dbd8]),
            ([u32::MAX; 4], [u32::MAX; 2], [0x408f_276d, 0x41c8_3b0e, 0xa20b_c7c6, 0x6d54_51fd]),
            (
                [0x243f_6a88, 0x85a3_08d3, 0x1319_8a2e, 0x0370_7344],
                [0xa409_3822, 0x299f_31d0],
                [0xd16c_fe09, 0x94fd_cceb, 0x5001_e420, 0x2412_6ea1],
            ),
        ];
        for (counter, key, want) in cases {
            assert_eq!(philox4x32_10(counter, key), want, "counter {counter:08x?} key {key:08x?}");
        }
    }

    #[test]
    fn uniform_is_word_zero_scaled() {
        // counter 0, key 0: word 0 is 0x6627e8d5, whose top 24 bits are 0x6627e8.
        assert_eq!(uniform(0, 0), 0x6627e8 as f32 / 16_777_216.0);
        // A negative seed keys by its two's-complement bits: -1 is the all-ones key.
        let w = philox4x32_10([u32::MAX, u32::MAX, 0, 0], [u32::MAX; 2]);
        assert_eq!(uniform(-1, u64::MAX), (w[0] >> 8) as f32 / 16_777_216.0);
    }
}
