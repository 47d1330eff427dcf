//! Engine selection by name, shared by `fit` and the benchmarks.

use std::fmt;
use std::str::FromStr;

use anyhow::{Result, bail};
use parvi_infer::{AdapterConfig, Engine, KernelConfig, Svgd};
use serde::{Deserialize, Serialize};

/// Methods `--method` accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Method {
    Svgd,
}

impl Method {
    pub const NAMES: [&'static str; 1] = ["svgd"];

    pub fn name(self) -> &'static str {
        match self {
            Method::Svgd => "svgd",
        }
    }

    pub fn build(self, kernel: &KernelConfig, adapter: &AdapterConfig) -> Result<Box<dyn Engine>> {
        Ok(match self {
            Method::Svgd => Box::new(Svgd::new(kernel.build()?, adapter.build()?)),
        })
    }
}

impl FromStr for Method {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "svgd" => Ok(Method::Svgd),
            other => bail!("unknown method `{other}` (expected one of: {})", Method::NAMES.join(", ")),
        }
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
