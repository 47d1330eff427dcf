//! Constraint transforms.
#[test]
fn stub() {}
