//! Bayesian logistic regression by SVGD on breast cancer: a posterior that classifies well, and
//! labels outside {0, 1} are refused.

mod common;

use common::{flex, uci_dir};
use parvi::infer::{AdapterConfig, BatchOrder, EngineRng, Particles, Rbf, RunConfig, Runner, Svgd};
use parvi::models::LogisticRegression;
use parvi::models::blr::classification_score;

#[test]
fn svgd_blr_classifies_breast_cancer() {
    let Some(dir) = uci_dir("breast-cancer") else {
        eprintln!("SKIPPED svgd_blr_classifies_breast_cancer: no UCI data (set PARVI_DATA_DIR)");
        return;
    };
    let device = flex();
    let ds = parvi_data::load("breast-cancer", &dir).unwrap();
    let data = parvi_data::prepare(&ds, 0, parvi_data::DevSplit::None).unwrap();
    let model = LogisticRegression::new(&data.x_train, &data.y_train, data.features, &device).unwrap();
    let start =
        Particles::gaussian(100, parvi::model::LogDensity::dim(&model), 0.0, 0.1, &mut EngineRng::new(2), &device)
            .unwrap();
    let mut svgd = Svgd::new(Box::new(Rbf::median()), AdapterConfig::adagrad(0.05).build().unwrap());
    let config = RunConfig { batch_size: Some(100), batch_order: BatchOrder::Shuffle, ..RunConfig::new(1000, 4) };
    let out = Runner::new(&mut svgd, &model, start, config).unwrap().run(&mut []).unwrap();
    let proba = model.predict_proba(out.particles.positions, &data.x_test, &device);
    let (accuracy, ll) = classification_score(&proba, &data.y_test);
    // The majority class is 63%; a working logistic regression on WDBC reaches about 95-98%.
    assert!(accuracy > 0.93, "accuracy {accuracy}");
    assert!(ll > -0.25, "test log-likelihood {ll}");
}

#[test]
fn labels_outside_zero_one_are_refused() {
    let device = flex();
    let err = LogisticRegression::new(&[0.0, 1.0], &[0.0, 2.0], 1, &device).unwrap_err().to_string();
    assert!(err.contains("labels") && err.contains('2'), "{err}");
}
