//! Distributions against independent f64 evaluations.

#[test]
fn builds() {}
