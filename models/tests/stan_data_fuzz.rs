//! A seeded random-mutation fuzz of Stan JSON data files through `StanData` and the data
//! block's checks a user's builder runs (sizes by field, bounds on scalars and arrays, an index
//! array, a matrix, and data given to constructors: `PoissonLog`'s counts, `Normal`'s scale,
//! an ODE's output times). Every case ends in a model's data or an error; no case panics; every
//! error names a field (with any element 1-based and inside the field as the file holds it) or,
//! for a file that is not JSON, its line and column. `PARVI_FUZZ_CASES=N` runs N cases.

use std::panic::{AssertUnwindSafe, catch_unwind};

use parvi_model::BackendKind;
use parvi_model::dist::{Normal, PoissonLog};
use parvi_models::stan_data::{StanData, StanDataError};
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use serde_json::Value;

const BASE: &str = r#"{"N": 5, "J": 2, "K": 3, "group": [1, 2, 2, 1, 2], "y": [0, 3, 1, 4, 2],
  "x": [0.5, -1.0, 2.0, 0.0, 1.5], "X": [[1, 0.5, 2], [1, -0.5, 0], [1, 1.5, 1], [1, 0, 0], [1, 2, 3]],
  "scale": 2.5, "p": 0.3, "ts": [0.5, 1, 2, 4, 8], "z": [[[1, 2], [3, 4]], [[5, 6], [7, 8]]]}"#;

/// The data block of a model that reads every kind of field, through the checks its builder
/// runs: `data { int<lower=1> N; int<lower=1> J; int<lower=1, upper=4> K; array[N] int<lower=1,
/// upper=J> group; array[N] int y; vector[N] x; matrix[N, K] X; real<lower=0> scale;
/// real<lower=0, upper=1> p; array[N] real ts; array[2, 2, 2] real z; }`, `y ~ poisson_log`,
/// `normal(0, scale)`, `ode_rk45(..., 0, ts, ...)`.
fn read_data_block(data: &StanData, device: &parvi_model::burn::tensor::Device) -> Result<(), StanDataError> {
    let n = data.size_in("N", 1..)?;
    let j = data.size_in("J", 1..)?;
    let k = data.int_in("K", 1..=4)?;
    let group = data.ints("group", "N")?.within(1..=data.int("J")?)?;
    group.index_tensor(j, device)?;
    let y = data.ints("y", n)?.tensor(device);
    data.check("y", PoissonLog::new(y))?;
    data.vector("x", "N")?.finite()?;
    data.matrix("X", "N", k as usize)?.finite()?;
    let scale = data.real_in("scale", 0.0..)?;
    data.check("scale", Normal::<2>::new(0.0, scale))?;
    data.real_in("p", 0.0..=1.0)?;
    let ts = data.vector("ts", "N")?;
    data.check("ts", parvi_model::ode::check_times(0.0, ts.values()))?;
    data.reals("z", &[2.into(), 2.into(), 2.into()])?.within(..=100.0)?;
    Ok(())
}

/// A JSON value of a hostile kind.
fn random_value(rng: &mut SmallRng) -> Value {
    match rng.random_range(0..12) {
        0 => Value::Null,
        1 => (-rng.random_range(0..5i64)).into(),
        2 => 0.into(),
        3 => rng.random_range(0.0..10.0f64).into(),
        4 => Value::String(["NaN", "Inf", "-Inf", "x", ""][rng.random_range(0..5)].into()),
        5 => serde_json::json!([]),
        6 => serde_json::json!([[1, 2], [3]]),
        7 => (i64::MAX - rng.random_range(0..2i64)).into(),
        8 => 1e300.into(),
        9 => serde_json::json!({"a": 1}),
        10 => true.into(),
        _ => rng.random_range(1..6i64).into(),
    }
}

/// Replaces one value at a random depth under a random field (or removes the field).
fn structural_edit(rng: &mut SmallRng, value: &mut Value) {
    let Value::Object(fields) = value else { return };
    let keys: Vec<String> = fields.keys().cloned().collect();
    let key = &keys[rng.random_range(0..keys.len())];
    if rng.random_range(0..8) == 0 {
        fields.remove(key);
    } else if let Some(at) = fields.get_mut(key) {
        replace_at_depth(rng, at);
    }
}

/// Replaces `value` or, at random, an element of it (recursively).
fn replace_at_depth(rng: &mut SmallRng, value: &mut Value) {
    if let Value::Array(items) = value
        && !items.is_empty()
        && rng.random_range(0..3) != 0
    {
        let i = rng.random_range(0..items.len());
        return replace_at_depth(rng, &mut items[i]);
    }
    *value = random_value(rng);
}

/// A byte-level mutation: flips, deletions, insertions of JSON's punctuation, a cut.
fn byte_edit(rng: &mut SmallRng, bytes: &mut Vec<u8>) {
    for _ in 0..rng.random_range(1..4) {
        if bytes.is_empty() {
            return;
        }
        let at = rng.random_range(0..bytes.len());
        match rng.random_range(0..5) {
            0 => bytes[at] = b"{}[],:\"-.e0123456789 "[rng.random_range(0..21)],
            1 => {
                bytes.remove(at);
            }
            2 => bytes.insert(at, b"{}[],:\"-.e9"[rng.random_range(0..11)]),
            3 => bytes.truncate(at),
            _ => bytes[at] ^= 1 << rng.random_range(0..7),
        }
    }
}

/// The 1-based indices of `element [a,b]` in `message`, if it has one.
fn element_of(message: &str) -> Option<Vec<usize>> {
    let start = message.find("element [")? + "element [".len();
    let end = start + message[start..].find(']')?;
    message[start..end].split(',').map(|i| i.trim().parse().ok()).collect()
}

/// The shape of a JSON value as nested arrays (each axis' longest row, for a ragged one).
fn json_shape(value: &Value) -> Vec<usize> {
    match value {
        Value::Array(items) => {
            let inner = items.iter().map(json_shape).fold(Vec::new(), |a: Vec<usize>, b| {
                if a.len() >= b.len() {
                    a.iter().enumerate().map(|(i, &x)| x.max(b.get(i).copied().unwrap_or(0))).collect()
                } else {
                    b.iter().enumerate().map(|(i, &x)| x.max(a.get(i).copied().unwrap_or(0))).collect()
                }
            });
            std::iter::once(items.len()).chain(inner).collect()
        }
        _ => Vec::new(),
    }
}

#[test]
fn mutated_stan_data_files_give_data_or_an_error_naming_a_field_or_a_position() {
    let device = BackendKind::Flex.device().unwrap();
    let base: Value = serde_json::from_str(BASE).unwrap();
    read_data_block(&StanData::parse(BASE, "fuzz.json").unwrap(), &device).expect("the base file fits its block");
    let cases: usize = std::env::var("PARVI_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(20_000);
    let mut rng = SmallRng::seed_from_u64(0x5747_DA7A);
    let (mut accepted, mut by_field, mut by_position) = (0, 0, 0);
    for case in 0..cases {
        let text = if rng.random_range(0..3) == 0 {
            let mut bytes = BASE.as_bytes().to_vec();
            byte_edit(&mut rng, &mut bytes);
            String::from_utf8_lossy(&bytes).into_owned()
        } else {
            let mut value = base.clone();
            for _ in 0..rng.random_range(1..3) {
                structural_edit(&mut rng, &mut value);
            }
            value.to_string()
        };
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            StanData::parse(&text, "fuzz.json").and_then(|data| read_data_block(&data, &device))
        }));
        let outcome = outcome.unwrap_or_else(|_| panic!("case {case} panicked on {text}"));
        let Err(error) = outcome else {
            accepted += 1;
            continue;
        };
        let message = error.to_string();
        assert!(message.starts_with("data file fuzz.json: "), "case {case}: {message}\n{text}");
        match &error {
            StanDataError::Json { line, column, .. } => {
                assert!(*line >= 1 && message.contains(&format!("line {line}, column {column}")), "{message}");
                by_position += 1;
            }
            StanDataError::NotObject { .. } => by_position += 1,
            StanDataError::Missing { field, .. } | StanDataError::Invalid { field, .. } => {
                assert!(message.contains(&format!("field `{field}`")), "case {case}: {message}\n{text}");
                if let Some(element) = element_of(&message) {
                    // 1-based, and inside the field as the file holds it.
                    let value: Value = serde_json::from_str(&text).unwrap();
                    let shape = json_shape(&value[field.as_str()]);
                    assert!(
                        element.len() <= shape.len().max(1)
                            && element
                                .iter()
                                .zip(shape.iter().chain(std::iter::repeat(&1)))
                                .all(|(&i, &n)| i >= 1 && i <= n),
                        "case {case}: element {element:?} outside {shape:?}: {message}\n{text}"
                    );
                }
                by_field += 1;
            }
            other => panic!("case {case}: an error naming neither a field nor a position: {other}\n{text}"),
        }
    }
    // The fuzz reached every kind of outcome.
    assert!(accepted > 0 && by_field > cases / 2 && by_position > cases / 20, "{accepted} {by_field} {by_position}");
}
