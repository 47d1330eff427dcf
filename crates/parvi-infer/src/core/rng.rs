//! The engines' random numbers: a seeded ChaCha8 stream whose position is part of a checkpoint,
//! drawn on the host so every backend sees the same numbers.

use burn::tensor::{Device, Tensor};
use chacha20::ChaCha8Rng;
use rand::{Rng, RngExt, SeedableRng};
use rand_distr_free::standard_normal;
use serde::{Deserialize, Serialize};

/// A seeded random stream that can be saved and restored exactly.
pub struct EngineRng {
    seed: u64,
    rng: ChaCha8Rng,
}

impl Clone for EngineRng {
    fn clone(&self) -> Self {
        // ChaCha8Rng is not Clone: its (seed, position) state is all there is to copy.
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed);
        rng.set_word_pos(self.rng.get_word_pos());
        Self { seed: self.seed, rng }
    }
}

impl std::fmt::Debug for EngineRng {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineRng").field("seed", &self.seed).field("word_pos", &self.rng.get_word_pos()).finish()
    }
}

/// The saved position of an [`EngineRng`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RngState {
    /// The seed the stream started from.
    pub seed: u64,
    /// ChaCha word position, as a decimal string (JSON numbers stop at 64 bits).
    pub word_pos: String,
}

impl EngineRng {
    /// A stream at the start of seed `seed`.
    pub fn new(seed: u64) -> Self {
        Self { seed, rng: ChaCha8Rng::seed_from_u64(seed) }
    }

    /// The stream's position, for a checkpoint.
    pub fn state(&self) -> RngState {
        RngState { seed: self.seed, word_pos: self.rng.get_word_pos().to_string() }
    }

    /// The stream at a saved position; `None` when the position does not parse.
    pub fn from_state(state: &RngState) -> Option<Self> {
        let mut rng = Self::new(state.seed);
        rng.rng.set_word_pos(state.word_pos.parse().ok()?);
        Some(rng)
    }

    /// A uniform draw on `[0, 1)`.
    pub fn uniform(&mut self) -> f64 {
        self.rng.random::<f64>()
    }

    /// A standard normal draw.
    pub fn normal(&mut self) -> f64 {
        standard_normal(&mut self.rng)
    }

    /// A `[rows, cols]` tensor of independent `N(0, 1)` draws.
    pub fn normal_tensor(&mut self, rows: usize, cols: usize, device: &Device) -> Tensor<2> {
        let values: Vec<f32> = (0..rows * cols).map(|_| self.normal() as f32).collect();
        parvi_model::tensor_ops::matrix_from_vec(values, rows, cols, device)
    }

    /// `k` distinct indices from `0..n` (partial Fisher-Yates), in draw order.
    pub fn choose(&mut self, n: usize, k: usize) -> Vec<usize> {
        let mut pool: Vec<usize> = (0..n).collect();
        for i in 0..k.min(n) {
            let j = i + self.rng.random_range(0..n - i);
            pool.swap(i, j);
        }
        pool.truncate(k.min(n));
        pool
    }

    /// A random permutation of `0..n`.
    pub fn permutation(&mut self, n: usize) -> Vec<usize> {
        self.choose(n, n)
    }

    /// A new stream seeded by this one's next draw: one per chain of a sampler whose chains
    /// advance at their own pace (or on their own threads), so each chain's draws do not depend
    /// on the order the chains are served in.
    pub fn split(&mut self) -> EngineRng {
        Self::new(self.rng.random::<u64>())
    }

    /// The underlying generator, for `rand` distributions.
    pub fn inner(&mut self) -> &mut impl Rng {
        &mut self.rng
    }
}

/// Polar Box-Muller, kept here so draws do not depend on a distribution crate's algorithm choice.
mod rand_distr_free {
    use rand::{Rng, RngExt};

    pub fn standard_normal<R: Rng + ?Sized>(rng: &mut R) -> f64 {
        loop {
            let u = 2.0 * rng.random::<f64>() - 1.0;
            let v = 2.0 * rng.random::<f64>() - 1.0;
            let s = u * u + v * v;
            if s > 0.0 && s < 1.0 {
                return u * (-2.0 * s.ln() / s).sqrt();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restored_stream_continues_identically() {
        let mut a = EngineRng::new(7);
        for _ in 0..13 {
            a.normal();
        }
        let mut b = EngineRng::from_state(&a.state()).unwrap();
        for _ in 0..50 {
            assert_eq!(a.normal().to_bits(), b.normal().to_bits());
        }
    }

    #[test]
    fn choose_gives_distinct_indices() {
        let mut r = EngineRng::new(1);
        let mut c = r.choose(50, 20);
        c.sort();
        c.dedup();
        assert_eq!(c.len(), 20);
        assert!(c.iter().all(|&i| i < 50));
    }
}
