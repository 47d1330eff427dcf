//! Engine selection by name, shared by `fit` and the benchmarks.
//!
//! Every engine is built from one [`EngineSpec`]: the shared kernel and step-size adapter, plus
//! the method's own options as a TOML table (`--opt key=value` on the command line, an
//! `[options]` table in a config file). Each method deserialises that table into its own config
//! struct, so an unknown or mistyped option is an error naming it.

//! Engine selection by name, shared by `fit`, `bnn` and the benchmarks: a thin layer over the
//! library's registry ([`parvi_infer::MethodConfig`]).
//!
//! Every engine is built from one [`EngineSpec`]: the shared kernel and step-size adapter, plus
//! the method's own options as a TOML table (`--opt key=value` on the command line, an
//! `[options]` table in a config file). The table is read as the method's config type, so an
//! unknown or mistyped option is an error naming it.

use anyhow::{Context, Result, bail};
use parvi_infer::{AdapterConfig, EngineSpec, KernelConfig, MethodConfig};
use serde::Deserialize;

/// An error when a step size was given (`--lr`) to a method without the shared step-size rule,
/// which would ignore it; `config` is `None` for a method outside the registry (NUTS, whose
/// step size adapts).
pub fn refuse_unused_lr(name: &str, config: Option<&MethodConfig>, lr: Option<f64>) -> Result<()> {
    if lr.is_some() && config.is_none_or(|c| !c.config().uses_step_rule()) {
        bail!(
            "invalid setting `--lr`: method `{name}` does not step with the shared step-size rule, so \
             `--lr` would be ignored (its own step settings, if any, go in `--opt`; see its options)"
        );
    }
    Ok(())
}

/// The method `name` with its options (`--opt`, or a config file's `[options]` table).
pub fn method_config(name: &str, options: &toml::Table) -> Result<MethodConfig> {
    // An unknown name is an error listing the known ones.
    MethodConfig::default_for(name)?;
    if options.contains_key("method") {
        bail!("invalid `--opt method`: choose the method with `--method`");
    }
    let mut table = options.clone();
    table.insert("method".into(), toml::Value::String(name.to_string()));
    let config = MethodConfig::deserialize(toml::Value::Table(table))
        .with_context(|| format!("invalid `--opt` for method `{name}`"))?;
    Ok(config)
}

/// The shared kernel by its command-line name (`rbf`, `imq`, `rbf-linear`), with a fixed RBF
/// bandwidth when given.
pub fn kernel_from_name(name: &str, bandwidth: Option<f64>) -> Result<KernelConfig> {
    Ok(match name {
        "rbf" => KernelConfig::Rbf { bandwidth },
        "imq" => KernelConfig::Imq { c: 1.0, beta: -0.5 },
        "rbf-linear" => KernelConfig::RbfLinear { bandwidth },
        other => bail!("invalid setting `--kernel`: unknown kernel `{other}` (expected rbf, imq or rbf-linear)"),
    })
}

/// The engine spec of method `name` with its options and the shared kernel and adapter.
pub fn engine_spec(
    name: &str,
    options: &toml::Table,
    kernel: KernelConfig,
    adapter: AdapterConfig,
) -> Result<EngineSpec> {
    Ok(EngineSpec::new(method_config(name, options)?, kernel, adapter))
}

/// Parses the `--opt KEY=VALUE` flags into a table. VALUE is read as a TOML value (`10`, `0.5`,
/// `true`, `[1, 2]`, `"text"`); anything that is not one is taken as a bare string.
pub fn parse_options(pairs: &[String]) -> Result<toml::Table> {
    let mut table = toml::Table::new();
    for pair in pairs {
        let Some((key, value)) = pair.split_once('=') else {
            bail!("invalid `--opt {pair}`: expected KEY=VALUE");
        };
        let key = key.trim();
        if key.is_empty() {
            bail!("invalid `--opt {pair}`: empty key");
        }
        let value = value.trim();
        let parsed = format!("v = {value}")
            .parse::<toml::Table>()
            .ok()
            .and_then(|mut t| t.remove("v"))
            .unwrap_or_else(|| toml::Value::String(value.to_string()));
        if table.insert(key.to_string(), parsed).is_some() {
            bail!("invalid `--opt {key}`: given twice");
        }
    }
    Ok(table)
}

/// Adapter names `--adapter` accepts.
pub fn adapter_from_name(name: &str, lr: f64) -> Result<AdapterConfig> {
    Ok(match name {
        "adagrad" | "adagrad-momentum" => AdapterConfig::adagrad(lr),
        "adam" => AdapterConfig::adam(lr),
        "rmsprop" => AdapterConfig::RmsProp { lr, rho: 0.9, eps: 1e-8, schedule: parvi_infer::Schedule::Constant },
        "sgd" => AdapterConfig::sgd(lr),
        other => bail!("unknown adapter `{other}` (expected one of: adagrad, adam, rmsprop, sgd)"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_parse_as_toml_values() {
        let t = parse_options(&["m=10".into(), "alpha = 0.5".into(), "mode=adversarial".into()]).unwrap();
        assert_eq!(t["m"].as_integer(), Some(10));
        assert_eq!(t["alpha"].as_float(), Some(0.5));
        assert_eq!(t["mode"].as_str(), Some("adversarial"));
        assert!(parse_options(&["novalue".into()]).is_err());
        assert!(parse_options(&["m=1".into(), "m=2".into()]).is_err());
    }

    #[test]
    fn svgd_rejects_options() {
        let err = method_config("svgd", &parse_options(&["m=10".into()]).unwrap()).err().unwrap();
        let err = format!("{err:#}");
        assert!(err.contains("`m`") && err.contains("svgd"), "{err}");
    }

    #[test]
    fn han_liu_printed_kernel_is_an_option() {
        let config = method_config("agf-svgd", &parse_options(&["kernel=printed".into()]).unwrap()).unwrap();
        assert!(matches!(config, MethodConfig::AgfSvgd(c) if c.kernel == parvi_infer::engines::HanLiuKernel::Printed));
        let err = method_config("gf-svgd", &parse_options(&["kernel=printd".into()]).unwrap()).err().unwrap();
        assert!(format!("{err:#}").contains("printd"), "{err:#}");
    }

    #[test]
    fn unknown_method_lists_the_known() {
        let err = method_config("svgdd", &toml::Table::new()).err().unwrap().to_string();
        assert!(err.contains("svgdd") && err.contains("mk-svgd"), "{err}");
    }
}
