//! Gap splits (Foong et al. 2019): split `f` holds out exactly the middle third of the rows
//! sorted by feature `f`, and trains on the rest.

use parvi_data::{Dataset, Split, Task};

#[test]
fn each_gap_split_holds_out_the_middle_third_of_its_sorted_feature() {
    // 11 rows, 2 features: feature 0 a permutation of 0..11, feature 1 its reverse with a tie.
    let perm = [7.0, 2.0, 9.0, 0.0, 5.0, 10.0, 1.0, 8.0, 3.0, 6.0, 4.0];
    let second = [3.0, 8.0, 1.0, 10.0, 5.0, 0.0, 9.0, 2.0, 7.0, 4.0, 5.0];
    let x: Vec<f64> = perm.iter().zip(&second).flat_map(|(a, b)| [*a, *b]).collect();
    let ds = Dataset {
        name: "toy".into(),
        task: Task::Regression,
        features: 2,
        rows: 11,
        x,
        y: vec![0.0; 11],
        splits: vec![Split { train: (0..8).collect(), test: (8..11).collect() }],
    };
    let gaps = ds.gap_splits();
    assert_eq!(gaps.len(), 2);
    // floor(11 / 3) = 3 .. floor(22 / 3) = 7: sorted positions 3, 4, 5, 6 held out.
    for (f, split) in gaps.iter().enumerate() {
        let value = |r: usize| ds.row(r)[f];
        assert_eq!(split.test.len(), 4);
        assert_eq!(split.train.len(), 7);
        let mut all: Vec<usize> = split.train.iter().chain(&split.test).copied().collect();
        all.sort_unstable();
        assert_eq!(all, (0..11).collect::<Vec<_>>(), "split {f} does not partition the rows");
        // Ranks by an independent count (ties broken by row index, as a stable sort does).
        let rank = |r: usize| (0..11).filter(|&o| value(o) < value(r) || (value(o) == value(r) && o < r)).count();
        for &r in &split.test {
            assert!((3..7).contains(&rank(r)), "split {f}: test row {r} has rank {}", rank(r));
        }
        for &r in &split.train {
            assert!(!(3..7).contains(&rank(r)), "split {f}: train row {r} has rank {}", rank(r));
        }
        assert!(split.train.windows(2).all(|w| w[0] < w[1]) && split.test.windows(2).all(|w| w[0] < w[1]));
    }
    // Feature 0 is a permutation of 0..11: the gap is exactly the values 3, 4, 5, 6.
    let mut held: Vec<f64> = gaps[0].test.iter().map(|&r| ds.row(r)[0]).collect();
    held.sort_by(f64::total_cmp);
    assert_eq!(held, vec![3.0, 4.0, 5.0, 6.0]);
    assert_eq!(ds.with_gap_splits().splits, gaps);
}
