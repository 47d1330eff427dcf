//! The registry: every method builds from its default config into the engine of the same name,
//! configs round-trip through serde as a config file writes them, a rule of one engine (a kernel
//! it does not take) is an error naming the setting, and a checkpoint of one method is refused by
//! another, naming both.

mod common;

use common::flex;
use parvi_infer::core::Checkpoint;
use parvi_infer::{
    AdapterConfig, CheckpointPolicy, EngineRng, EngineSpec, KernelConfig, MethodConfig, Particles, RunConfig, Runner,
};

#[test]
fn every_method_builds_from_its_default_config_under_its_own_name() {
    assert_eq!(MethodConfig::NAMES.len(), 17);
    for &name in MethodConfig::NAMES {
        let config = MethodConfig::default_for(name).unwrap();
        assert_eq!(config.name(), name);
        let engine =
            EngineSpec::new(config.clone(), KernelConfig::default(), AdapterConfig::default()).build().unwrap();
        assert_eq!(engine.name(), name, "the engine built for `{name}` calls itself `{}`", engine.name());
        // As a config file writes it: the method's name as the tag, its options beside it.
        let value = serde_json::to_value(&config).unwrap();
        assert_eq!(value["method"], name);
        let back: MethodConfig = serde_json::from_value(value).unwrap();
        assert_eq!(back, config);
    }
    let err = MethodConfig::default_for("svgdd").unwrap_err().to_string();
    assert!(err.contains("svgdd") && err.contains("svgd-adversarial"), "{err}");
}

#[test]
fn options_and_rules_are_named() {
    let parse = |v: serde_json::Value| serde_json::from_value::<MethodConfig>(v).map_err(|e| e.to_string());
    let err = parse(serde_json::json!({"method": "svgd-subset", "mm": 3})).unwrap_err();
    assert!(err.contains("mm"), "{err}");
    let config = parse(serde_json::json!({"method": "svgd-subset", "m": 3})).unwrap();
    assert_eq!(config, MethodConfig::SvgdSubset(parvi_infer::SubsetConfig { m: 3 }));
    // Engines with their own kernels refuse a shared one, naming the setting.
    let imq = KernelConfig::Imq { c: 1.0, beta: -0.5 };
    for name in ["mk-svgd", "sgld-r", "svgd-adversarial"] {
        let spec = EngineSpec::new(MethodConfig::default_for(name).unwrap(), imq.clone(), AdapterConfig::default());
        let err = spec.build().err().unwrap().to_string();
        assert!(err.contains("`kernel`") && err.contains(name), "{name}: {err}");
    }
    // Stein Points takes the shared kernel as its Stein kernel's base (Chen et al.'s IMQ here).
    let spec = EngineSpec::new(MethodConfig::default_for("stein-points").unwrap(), imq, AdapterConfig::default());
    assert!(spec.build().is_ok());
}

#[test]
fn a_checkpoint_of_one_method_is_refused_by_another() {
    let device = flex();
    let target = parvi_models::builtin_target("gaussian", &device).unwrap();
    let start = Particles::gaussian(10, 2, 0.0, 1.0, &mut EngineRng::new(1), &device).unwrap();
    let build = |name: &str| {
        EngineSpec::new(MethodConfig::default_for(name).unwrap(), KernelConfig::default(), AdapterConfig::adagrad(0.05))
            .build()
            .unwrap()
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ckpt.json");
    let mut svgd = build("svgd");
    let config =
        RunConfig { checkpoint: Some(CheckpointPolicy { path: path.clone(), every: 2 }), ..RunConfig::new(2, 0) };
    Runner::new(svgd.as_mut(), target.density.as_ref(), start, config).unwrap().run(&mut []).unwrap();
    let checkpoint = Checkpoint::load(&path).unwrap();
    let mut other = build("svgd-subset");
    let err = Runner::resume(other.as_mut(), target.density.as_ref(), RunConfig::new(4, 0), &checkpoint, &device)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("`svgd`") && err.contains("`svgd-subset`"), "{err}");
}
