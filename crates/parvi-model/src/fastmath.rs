//! Elementwise `exp` for `f32` slices that the compiler vectorises: range reduction to
//! `[-ln 2 / 2, ln 2 / 2]` and a polynomial, with no branches and no library call, so that a
//! loop over a kernel tile runs 8 lanes at a time (AVX2 with FMA where the CPU has them, chosen at
//! run time) instead of one scalar libm call per entry.
//!
//! The method is Cephes' `expf` (Moshier), as Eigen's vectorised `pexp` for floats: `x = n ln 2 + r`
//! with `n` the nearest integer to `x / ln 2` and `ln 2` split in two (Cody & Waite) so that `r`
//! is exact, `e^r` by a degree-7 polynomial (Taylor's first two terms exact, a minimax fit for
//! the rest), and `2^n` built in the exponent bits. Within 2 units in the last place of `f32`
//! (checked against `f64::exp` over the whole range in the tests).
//!
//! Edges: `exp(x) = 0` below `ln` of half the smallest subnormal (about -103.97), subnormal results
//! on the way there (the scale `2^n` is applied as two normal factors, so nothing is flushed), `inf`
//! above `ln(f32::MAX)` (about 88.72) and at `inf`, `0` at `-inf`, NaN for NaN.
//! The `_flushed` forms (for kernel tiles) give exactly 0 wherever the result would be
//! subnormal, without subnormal arithmetic: on x86 each subnormal operand or result costs a
//! microcode assist of about a hundred cycles.

/// `1 / ln 2`.
const LOG2E: f32 = std::f32::consts::LOG2_E;
/// `ln 2` split for an exact range reduction: `C1` has 9 significant bits, so `n C1` is exact for
/// `|n| < 2^15`; `C1 + C2` is `ln 2` to about 2^-35.
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// Inputs are clamped to `[LOWEST, HIGHEST]`: below, the result rounds to 0 anyway (`e^-104` is
/// under half the smallest subnormal); above, to `inf` (`ln(f32::MAX) = 88.7228`). Both keep
/// `n` within `[-151, 129]`, whose halves are normal exponents.
const LOWEST: f32 = -104.0;
const HIGHEST: f32 = 88.8;
/// `1.5 2^23`: adding it rounds a float of magnitude below `2^22` to the nearest integer, which
/// then sits in the low bits of the sum's mantissa.
const ROUNDER: f32 = 12_582_912.0;
/// Cephes' coefficients of `(e^r - 1 - r) / r^2` on `[-ln 2 / 2, ln 2 / 2]`, highest first (the
/// last, 0.50000001201, is 0.5 in `f32`).
const POLY: [f32; 6] = [1.987_569_1e-4, 1.398_199_9e-3, 8.333_452e-3, 4.166_579_6e-2, 1.666_666_5e-1, 0.5];

/// `a b + c`, fused (one rounding) where the caller's target has FMA instructions, else two
/// roundings: `f32::mul_add` without hardware FMA is a slow library call that stops
/// vectorisation.
#[inline(always)]
fn madd<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA { a.mul_add(b, c) } else { a * b + c }
}

/// `2^k` for `k` in `[-126, 127]`, from its exponent bits.
#[inline(always)]
fn pow2(k: i32) -> f32 {
    f32::from_bits(((k + 127) as u32) << 23)
}

/// The flushed `exp`'s lowest input, just above `ln` of `f32`'s smallest normal (-87.3365):
/// `n` is then at least -126, so every factor and the result are normal.
const LOWEST_NORMAL: f32 = -87.33;

/// `e^x`, branch-free (see the module's notes). With `FLUSH`, inputs below [`LOWEST_NORMAL`] give
/// exactly 0, and the arithmetic runs on the clamped input, so no lane ever holds a subnormal.
#[inline(always)]
fn exp_with<const FMA: bool, const FLUSH: bool>(x: f32) -> f32 {
    let tiny = FLUSH && x < LOWEST_NORMAL;
    // NaN passes through `clamp` and stays NaN through every product below.
    let x = x.clamp(if FLUSH { LOWEST_NORMAL } else { LOWEST }, HIGHEST);
    // n = round(x / ln 2), read off the rounded sum's bits (no float-to-int conversion, which
    // needs fix-up code for NaN and out-of-range lanes).
    let shifted = madd::<FMA>(x, LOG2E, ROUNDER);
    let n = shifted - ROUNDER;
    let k = shifted.to_bits() as i32 - ROUNDER.to_bits() as i32;
    let r = madd::<FMA>(n, -LN2_LO, madd::<FMA>(n, -LN2_HI, x));
    let r2 = r * r;
    let p = POLY[1..].iter().fold(POLY[0], |acc, &c| madd::<FMA>(acc, r, c));
    let e_r = madd::<FMA>(p, r2, r) + 1.0;
    // 2^k as two normal factors (k in [-151, 129]): subnormal results round once, at the end.
    let half = k >> 1;
    let e = e_r * pow2(half) * pow2(k - half);
    if tiny { 0.0 } else { e }
}

/// `e^x` for one `f32`, within 2 ulp; the scalar form of [`exp_in_place`].
#[inline]
pub fn exp_f32(x: f32) -> f32 {
    exp_with::<false, false>(x)
}

/// `v <- e^v` for every entry, vectorised (AVX2 and FMA where the CPU has them).
pub fn exp_in_place(values: &mut [f32]) {
    map_in_place::<false>(values, 1.0);
}

/// `v <- e^(scale v)` for every entry, vectorised: an RBF kernel tile `exp(-r^2 / (2 h^2))`
/// from its squared distances in one pass.
pub fn exp_scaled_in_place(values: &mut [f32], scale: f32) {
    map_in_place::<false>(values, scale);
}

/// `v <- e^(scale v)` for every entry as [`exp_scaled_in_place`], with the entries below `f32`'s
/// smallest normal flushed to 0 ([`exp_f32_flushed`]): a kernel tile's far pairs.
pub fn exp_scaled_flushed_in_place(values: &mut [f32], scale: f32) {
    map_in_place::<true>(values, scale);
}

fn map_in_place<const FLUSH: bool>(values: &mut [f32], scale: f32) {
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        // SAFETY: the CPU has the features the function is compiled for (checked just above).
        unsafe { exp_scaled_avx2::<FLUSH>(values, scale) };
        return;
    }
    values.iter_mut().for_each(|v| *v = exp_with::<false, FLUSH>(*v * scale));
}

/// Whether the CPU has AVX2 and FMA (cached by the standard library after the first call).
#[cfg(target_arch = "x86_64")]
#[inline]
pub fn has_avx2_fma() -> bool {
    std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
}

/// Whether the CPU has AVX2 and FMA: never off x86-64.
#[cfg(not(target_arch = "x86_64"))]
#[inline]
pub fn has_avx2_fma() -> bool {
    false
}

/// The widest vector instructions that this CPU has and that the hot loops are compiled for,
/// chosen at run time: the build itself targets plain x86-64 (SSE2, four `f32` lanes), so that
/// one binary runs on any x86-64 machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Simd {
    /// AVX-512 (16 `f32` lanes), with AVX2 and FMA (the kernel tiles: 20% faster per pair than
    /// AVX2 on an AMD EPYC).
    Avx512,
    /// AVX2 (8 lanes) with fused multiply-adds.
    Avx2,
    /// What the build targets (SSE2 on x86-64), without FMA.
    Baseline,
}

impl Simd {
    /// The widest level this CPU runs (the standard library caches the CPU's features, so
    /// this is a few loads).
    #[inline]
    pub fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        if has_avx2_fma() {
            return if std::arch::is_x86_feature_detected!("avx512f") { Simd::Avx512 } else { Simd::Avx2 };
        }
        Simd::Baseline
    }

    /// This one and every narrower one (for tests that compare the levels).
    pub fn with_narrower(self) -> Vec<Simd> {
        match self {
            Simd::Avx512 => vec![Simd::Avx512, Simd::Avx2, Simd::Baseline],
            Simd::Avx2 => vec![Simd::Avx2, Simd::Baseline],
            Simd::Baseline => vec![Simd::Baseline],
        }
    }

    /// `kernel.run()` compiled for this level's instructions: its loops (inlined into `run`,
    /// so mark their helpers `#[inline(always)]`) run as many lanes as the level has. Rust
    /// never fuses a multiply and an add on its own, so unless the kernel calls `mul_add` its
    /// results are the baseline's to the bit; only the width changes. A level this CPU lacks
    /// runs the baseline. (A trait and not a closure: a closure's body is a function of its
    /// own that LLVM need not inline into the wider caller, and then runs at the baseline.)
    #[inline(always)]
    pub fn vectorise<K: Vectorised>(self, kernel: K) -> K::Output {
        match self {
            // SAFETY: the CPU has the level's features (checked by `detect` on the spot).
            #[cfg(target_arch = "x86_64")]
            Simd::Avx512 if Simd::detect() == Simd::Avx512 => unsafe { run_avx512(kernel) },
            // SAFETY: as above.
            #[cfg(target_arch = "x86_64")]
            Simd::Avx2 if has_avx2_fma() => unsafe { run_avx2(kernel) },
            _ => kernel.run(),
        }
    }
}

/// A loop nest to run as wide as the CPU allows ([`Simd::vectorise`]). Implement `run` with
/// `#[inline(always)]`: it is compiled once for each level.
pub trait Vectorised {
    /// What the kernel returns.
    type Output;
    /// The kernel's work.
    fn run(self) -> Self::Output;
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
fn run_avx512<K: Vectorised>(kernel: K) -> K::Output {
    kernel.run()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn run_avx2<K: Vectorised>(kernel: K) -> K::Output {
    kernel.run()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn exp_scaled_avx2<const FLUSH: bool>(values: &mut [f32], scale: f32) {
    values.iter_mut().for_each(|v| *v = exp_with::<true, FLUSH>(*v * scale));
}

/// `e^x` with fused multiply-adds, for loops compiled for AVX2 and FMA elsewhere (the kernel
/// tiles); the same function as [`exp_f32`] to 2 ulp. Only call it from code compiled with the
/// `fma` target feature: without it each `mul_add` is a library call.
#[inline(always)]
pub fn exp_f32_fma(x: f32) -> f32 {
    exp_with::<true, false>(x)
}

/// `e^x` as [`exp_f32`] where the result is a normal float, and exactly 0 below `f32`'s smallest
/// normal (`x < -87.33`), computed without subnormal arithmetic. For kernel matrices: an RBF
/// tile's far pairs underflow, and on x86 every operation that reads or writes a subnormal takes
/// a microcode assist of about a hundred cycles (a 2-D tile whose points span six bandwidths ran
/// 19 times slower); such entries weigh below `1.2e-38` against the diagonal's 1.
#[inline(always)]
pub fn exp_f32_flushed(x: f32) -> f32 {
    exp_with::<false, true>(x)
}

/// [`exp_f32_flushed`] with fused multiply-adds, under the conditions of [`exp_f32_fma`].
#[inline(always)]
pub fn exp_f32_fma_flushed(x: f32) -> f32 {
    exp_with::<true, true>(x)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Units in the last place of `f32` between `got` and the exact `want`; below the smallest
    /// normal the spacing of subnormals.
    fn ulps(got: f32, want: f64) -> f64 {
        let spacing = (want.abs() * f64::from(f32::EPSILON)).max(f64::from(f32::from_bits(1)));
        (f64::from(got) - want).abs() / spacing
    }

    /// The worst error over the whole range where `exp` is neither 0 nor `inf`, on every
    /// 97th float (about 22 million points: every binade, the subnormal range included).
    fn worst_error(f: impl Fn(f32) -> f32) -> (f64, f32) {
        let (mut worst, mut at) = (0.0f64, 0.0f32);
        let mut check = |x: f32| {
            let want = f64::from(x).exp();
            // Above f32::MAX (to nearest) the answer is inf, and nothing else will do.
            let err = if (want as f32).is_infinite() {
                if f(x) == f32::INFINITY { 0.0 } else { f64::INFINITY }
            } else {
                ulps(f(x), want)
            };
            if err > worst {
                (worst, at) = (err, x);
            }
        };
        // Positive floats up to 89 and negative ones down to -104, by bit pattern.
        for bits in (0..89.0f32.to_bits()).step_by(97) {
            check(f32::from_bits(bits));
            let neg = -f32::from_bits(bits);
            if neg >= -104.0 {
                check(neg);
            }
        }
        (worst, at)
    }

    #[test]
    fn exp_is_within_two_ulp_over_the_whole_range() {
        let (worst, at) = worst_error(exp_f32);
        assert!(worst <= 2.0, "worst error {worst} ulp at {at}");
    }

    /// The FMA form, as the vectorised loops run it (through the slice function, which takes the
    /// AVX2 path on a CPU that has it).
    #[test]
    fn vectorised_exp_is_within_two_ulp_over_the_whole_range() {
        let (worst, at) = worst_error(|x| {
            let mut v = [x];
            exp_in_place(&mut v);
            v[0]
        });
        assert!(worst <= 2.0, "worst error {worst} ulp at {at}");
        let xs: Vec<f32> = (0..1000).map(|i| -100.0 + 0.188 * i as f32).collect();
        let mut scaled = xs.iter().map(|x| x / -0.5).collect::<Vec<_>>();
        exp_scaled_in_place(&mut scaled, -0.5);
        for (x, e) in xs.iter().zip(&scaled) {
            assert!(ulps(*e, f64::from(*x).exp()) <= 2.0, "exp({x}) = {e}");
        }
    }

    /// The flushed forms are the plain ones to the bit where the result is normal, and exactly 0
    /// where it would be subnormal (the plain ones keep the subnormals); NaN stays NaN.
    #[test]
    fn flushed_exp_is_the_plain_one_above_the_smallest_normal_and_zero_below() {
        let mut scaled: Vec<f32> = Vec::new();
        for bits in (0..104.0f32.to_bits()).step_by(89) {
            let x = -f32::from_bits(bits);
            let (plain, flushed) = (exp_f32(x), exp_f32_flushed(x));
            if x >= LOWEST_NORMAL {
                assert_eq!(plain.to_bits(), flushed.to_bits(), "exp({x})");
                assert!(flushed.is_normal(), "exp({x}) = {flushed}");
            } else {
                assert_eq!(flushed, 0.0, "exp({x})");
            }
            assert_eq!(exp_f32_fma_flushed(x) == 0.0, x < LOWEST_NORMAL, "fma form at {x}");
            scaled.push(x);
        }
        assert!(exp_f32(-95.0) > 0.0 && exp_f32_flushed(-95.0) == 0.0);
        assert!(exp_f32_flushed(f32::NAN).is_nan() && exp_f32_flushed(f32::NEG_INFINITY) == 0.0);
        let want: Vec<f32> = scaled.iter().map(|&x| if x < LOWEST_NORMAL { 0.0 } else { exp_f32(x) }).collect();
        let mut got: Vec<f32> = scaled.iter().map(|x| x * 2.0).collect();
        exp_scaled_flushed_in_place(&mut got, 0.5);
        for ((x, g), w) in scaled.iter().zip(&got).zip(&want) {
            assert!(ulps(*g, f64::from(*w)) <= 2.0 && (*g == 0.0) == (*w == 0.0), "exp({x}) = {g}, want {w}");
        }
    }

    /// Underflow to 0 (and not before: the subnormal range is kept), overflow to `inf`, the
    /// infinities and NaN.
    #[test]
    fn exp_edges() {
        for f in [exp_f32 as fn(f32) -> f32, |x| {
            let mut v = [x; 9];
            exp_in_place(&mut v);
            v[3]
        }] {
            assert_eq!(f(0.0), 1.0);
            assert_eq!(f(-0.0), 1.0);
            assert_eq!(f(-104.0), 0.0);
            assert_eq!(f(-150.0), 0.0);
            assert_eq!(f(f32::NEG_INFINITY), 0.0);
            assert_eq!(f(f32::MIN), 0.0);
            // e^-103.5 = 1.09e-45: the smallest subnormal (1.4e-45) to nearest.
            assert_eq!(f(-103.5), f32::from_bits(1));
            // e^-95 = 5.5e-42: subnormal, kept to its precision.
            assert!(ulps(f(-95.0), (-95.0f64).exp()) <= 1.0);
            assert!(ulps(f(88.72), f64::from(88.72f32).exp()) <= 2.0);
            assert_eq!(f(88.73), f32::INFINITY);
            assert_eq!(f(1e30), f32::INFINITY);
            assert_eq!(f(f32::INFINITY), f32::INFINITY);
            assert!(f(f32::NAN).is_nan());
            assert!(f(-f32::NAN).is_nan());
        }
    }
}
