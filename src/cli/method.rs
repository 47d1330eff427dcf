//! Engine selection by name, shared by `fit` and the benchmarks.
//!
//! Every engine is built from one [`EngineSpec`]: the shared kernel and step-size adapter, plus
//! the method's own options as a TOML table (`--opt key=value` on the command line, an
//! `[options]` table in a config file). Each method deserialises that table into its own config
//! struct, so an unknown or mistyped option is an error naming it.

use std::fmt;
use std::str::FromStr;

use anyhow::{Context, Result, bail};
use parvi_infer::{AdapterConfig, Engine, KernelConfig, MkSvgd, MkSvgdConfig, Svgd};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// Methods `--method` accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Method {
    Svgd,
    MkSvgd,
    Sgld,
    SgldR,
    MmdFw,
    SteinPoints,
    GfSvgd,
    ASvgd,
    AgfSvgd,
    SvgdSubset,
    SvgdCf,
    SvgdInduced,
    SvgdAdversarial,
}

impl Method {
    pub const ALL: &[Method] = &[
        Method::Svgd,
        Method::MkSvgd,
        Method::Sgld,
        Method::SgldR,
        Method::MmdFw,
        Method::SteinPoints,
        Method::GfSvgd,
        Method::ASvgd,
        Method::AgfSvgd,
        Method::SvgdSubset,
        Method::SvgdCf,
        Method::SvgdInduced,
        Method::SvgdAdversarial,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Method::Svgd => "svgd",
            Method::MkSvgd => "mk-svgd",
            Method::Sgld => "sgld",
            Method::SgldR => "sgld-r",
            Method::MmdFw => "mmd-fw",
            Method::SteinPoints => "stein-points",
            Method::GfSvgd => "gf-svgd",
            Method::ASvgd => "a-svgd",
            Method::AgfSvgd => "agf-svgd",
            Method::SvgdSubset => "svgd-subset",
            Method::SvgdCf => "svgd-cf",
            Method::SvgdInduced => "svgd-induced",
            Method::SvgdAdversarial => "svgd-adversarial",
        }
    }

    pub fn build(self, spec: &EngineSpec) -> Result<Box<dyn Engine>> {
        let kernel = || spec.kernel.build();
        let adapter = || spec.adapter.build();
        Ok(match self {
            Method::Svgd => {
                spec.no_options(self)?;
                Box::new(Svgd::new(kernel()?, adapter()?))
            }
            // Kang's speed-up engines: `--opt m=..` subparticles or induced points.
            Method::SvgdSubset => {
                Box::new(parvi_infer::RandomSubset::new(&spec.options(self)?, kernel()?, adapter()?)?)
            }
            Method::SvgdCf => Box::new(parvi_infer::RandomSubset::with_control_functional(
                &spec.options(self)?,
                kernel()?,
                adapter()?,
            )?),
            Method::SvgdInduced => {
                Box::new(parvi_infer::RandomInduced::new(&spec.options(self)?, kernel()?, adapter()?)?)
            }
            Method::SvgdAdversarial => {
                // It learns an RBF bandwidth: `--bandwidth` (if given) is its starting value.
                let mut config = spec.options::<parvi_infer::AdversarialConfig>(self)?;
                match spec.kernel {
                    KernelConfig::Rbf { bandwidth } => config.h0 = config.h0.or(bandwidth),
                    KernelConfig::Imq { .. } => {
                        bail!("method `{self}` learns an RBF bandwidth: `--kernel imq` does not apply")
                    }
                }
                Box::new(parvi_infer::AdversarialInduced::new(&config, adapter()?)?)
            }
            Method::MkSvgd => {
                // Its kernels are its own grid: a single `--kernel`/`--bandwidth` has no place.
                if spec.kernel != KernelConfig::default() {
                    bail!("method `{self}` sets its own kernels: use `--opt bandwidths=[...]` or `--opt log2-min=..`");
                }
                Box::new(MkSvgd::new(&spec.options::<MkSvgdConfig>(self)?, adapter()?)?)
            }
            Method::Sgld | Method::SgldR => {
                // Langevin engines take their step size from `--opt a=.. b=.. gamma=..`; the
                // shared adapter (`--lr`, `--adapter`) does not apply to them.
                let config = spec.options::<parvi_infer::SgldConfig>(self)?;
                match (self, &spec.kernel) {
                    (Method::Sgld, _) => Box::new(parvi_infer::Sgld::new(&config)?),
                    (_, KernelConfig::Rbf { bandwidth }) => {
                        Box::new(parvi_infer::Sgld::with_repulsion(&config, *bandwidth)?)
                    }
                    (_, KernelConfig::Imq { .. }) => {
                        bail!("method `{self}` uses the RBF kernel (median or `--bandwidth`)")
                    }
                }
            }
            // Grows one particle per step up to `--particles`; the adapter (`--lr`) drives only
            // the SVGD iterations that build the cache (`--opt cache=true`).
            Method::MmdFw => Box::new(parvi_infer::MmdFw::new(
                spec.options::<parvi_infer::MmdFwConfig>(self)?,
                spec.kernel.clone(),
                spec.adapter.clone(),
            )?),
            Method::SteinPoints => {
                // Its IMQ kernel is set by `--opt imq-c=.. imq-beta=..`.
                if spec.kernel != KernelConfig::default() {
                    bail!("method `{self}` uses its own IMQ kernel: use `--opt imq-c=.. --opt imq-beta=..`");
                }
                Box::new(parvi_infer::SteinPoints::new(spec.options::<parvi_infer::SteinPointsConfig>(self)?)?)
            }
            // Gradient-free: the model is used through its log density values only; the surrogate
            // is `N(surrogate-mean, surrogate-std^2 I)` or flat (`--opt surrogate=flat`), since the
            // command line cannot name an arbitrary density. The paper steps with `--adapter adam`.
            Method::GfSvgd => {
                let config = spec.options::<parvi_infer::GfSvgdConfig>(self)?;
                Box::new(parvi_infer::GfSvgd::new(kernel()?, adapter()?, config.surrogate()?))
            }
            // Annealed from p0 = `N(p0-mean, p0-std^2 I)` (start the particles there: `--init-std`)
            // over `--opt schedule=linear|geometric|list levels=.. steps-per-temperature=..`;
            // AGF-SVGD's surrogate by `--opt fit=leave-one-out|full fit-bandwidth=.. truncate-weights=..`.
            Method::ASvgd | Method::AgfSvgd => {
                let config = spec.options::<parvi_infer::AnnealedConfig>(self)?;
                let (p0, schedule) = (config.p0()?, config.schedule()?);
                if self == Method::ASvgd {
                    if config.sets_curve_fit() {
                        bail!("`fit`, `fit-bandwidth` and `truncate-weights` are options of `agf-svgd`, not `{self}`");
                    }
                    Box::new(parvi_infer::AnnealedSvgd::new(kernel()?, adapter()?, p0, schedule))
                } else {
                    let fit = config.curve_fit()?;
                    Box::new(parvi_infer::AnnealedGfSvgd::new(kernel()?, adapter()?, p0, schedule, fit))
                }
            }
        })
    }
}

/// What builds an engine.
#[derive(Clone, Debug, Default)]
pub struct EngineSpec {
    pub kernel: KernelConfig,
    pub adapter: AdapterConfig,
    /// The method's own options.
    pub options: toml::Table,
}

impl EngineSpec {
    pub fn new(kernel: KernelConfig, adapter: AdapterConfig, options: toml::Table) -> Self {
        Self { kernel, adapter, options }
    }

    /// The method's options as its config type `T` (defaults for what is not given).
    pub fn options<T: DeserializeOwned>(&self, method: Method) -> Result<T> {
        T::deserialize(toml::Value::Table(self.options.clone()))
            .with_context(|| format!("invalid `--opt` for method `{method}`"))
    }

    /// For methods without options: any option is an error.
    pub fn no_options(&self, method: Method) -> Result<()> {
        if let Some(key) = self.options.keys().next() {
            bail!("invalid `--opt {key}`: method `{method}` takes no options");
        }
        Ok(())
    }
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

impl FromStr for Method {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        Method::ALL.iter().copied().find(|m| m.name() == s).with_context(|| {
            let names: Vec<_> = Method::ALL.iter().map(|m| m.name()).collect();
            format!("unknown method `{s}` (expected one of: {})", names.join(", "))
        })
    }
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
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
        let spec = EngineSpec { options: parse_options(&["m=10".into()]).unwrap(), ..Default::default() };
        let err = Method::Svgd.build(&spec).err().unwrap().to_string();
        assert!(err.contains("m") && err.contains("svgd"), "{err}");
    }
}
