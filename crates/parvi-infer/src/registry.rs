//! Every engine by its method name: the configuration a user writes in Rust or TOML, built into
//! a boxed [`Engine`].
//!
//! ```toml
//! method = "mk-svgd"
//! log2-min = -4
//! ```
//!
//! Adding an engine: its module under [`crate::engines`] with a config that implements
//! [`EngineConfig`], then one line in the `registry!` table here.

use serde::{Deserialize, Serialize};

use crate::engines::{
    AdversarialConfig, AnnealedConfig, AnnealedSvgdConfig, ControlFunctionalConfig, EngineConfig, EnsembleConfig,
    FunctionSpaceConfig, GfSvgdConfig, InducedConfig, MkSvgdConfig, MmdFwConfig, NutsConfig, PathfinderConfig,
    RepulsiveSgldConfig, SgldConfig, SteinPointsConfig, SubsetConfig, SvgdConfig,
};
use crate::{AdapterConfig, Engine, InferError, KernelConfig};

/// One line per engine: its name as the `method` tag spells it, its variant, its config type,
/// and a line of docs. The macro writes [`MethodConfig`] and its name tables from it.
macro_rules! registry {
    ($($name:literal => $variant:ident($config:ty), $doc:literal;)*) => {
        /// A method and its own options, tagged by the method's name (`method = "svgd-cf"`).
        #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
        #[serde(tag = "method")]
        pub enum MethodConfig {
            $(
                #[doc = $doc]
                #[serde(rename = $name)]
                $variant($config),
            )*
        }

        impl MethodConfig {
            /// Every method's name, as the `method` tag spells it.
            pub const NAMES: &'static [&'static str] = &[$($name),*];

            /// The method `name` with its default options; an unknown name is an error listing
            /// the known ones.
            pub fn default_for(name: &str) -> Result<Self, InferError> {
                match name {
                    $($name => Ok(Self::$variant(Default::default())),)*
                    other => Err(InferError::setting(
                        "method",
                        format!("unknown method `{other}` (expected one of: {})", Self::NAMES.join(", ")),
                    )),
                }
            }

            /// The method's name, as the `method` tag spells it; equal to its engine's
            /// [`Engine::name`].
            pub fn name(&self) -> &'static str {
                match self {
                    $(Self::$variant(_) => $name,)*
                }
            }

            /// The method's own configuration.
            pub fn config(&self) -> &dyn EngineConfig {
                match self {
                    $(Self::$variant(c) => c,)*
                }
            }
        }
    };
}

registry! {
    "svgd" => Svgd(SvgdConfig), "Stein variational gradient descent (Liu & Wang 2016).";
    "mk-svgd" => MkSvgd(MkSvgdConfig), "Multiple-kernel SVGD with learned kernel weights (Ai et al.).";
    "ensemble" => Ensemble(EnsembleConfig), "A deep ensemble: independent MAP particles, no repulsion (Lakshminarayanan et al. 2017).";
    "fpovi" => Fpovi(FunctionSpaceConfig), "Function-space particles: a kernel on network outputs (Wang et al. 2019).";
    "sgld" => Sgld(SgldConfig), "Stochastic-gradient Langevin dynamics (Welling & Teh 2011).";
    "sgld-r" => SgldR(RepulsiveSgldConfig), "SGLD with kernel repulsion between the chains.";
    "mmd-fw" => MmdFw(MmdFwConfig), "Greedy weighted particles by Frank-Wolfe on the MMD (Futami et al. 2019).";
    "stein-points" => SteinPoints(SteinPointsConfig), "Stein Points (Chen et al. 2018).";
    "gf-svgd" => GfSvgd(GfSvgdConfig), "Gradient-free SVGD (Han & Liu 2018).";
    "a-svgd" => ASvgd(AnnealedSvgdConfig), "Annealed SVGD (Han & Liu 2018).";
    "agf-svgd" => AgfSvgd(AnnealedConfig), "Annealed gradient-free SVGD (Han & Liu 2018).";
    "svgd-subset" => SvgdSubset(SubsetConfig), "Random-subset SVGD (Kang).";
    "svgd-cf" => SvgdCf(ControlFunctionalConfig), "Random-subset SVGD with control-functional weights (Kang).";
    "svgd-induced" => SvgdInduced(InducedConfig), "SVGD through random induced points (Kang).";
    "pathfinder" => Pathfinder(PathfinderConfig), "Multi-path Pathfinder: L-BFGS normal approximations and Pareto-smoothed importance resampling (Zhang et al. 2022).";
    "svgd-adversarial" => SvgdAdversarial(AdversarialConfig), "SVGD through adversarially placed induced points (Kang).";
    "nuts" => Nuts(NutsConfig), "The No-U-Turn sampler as Stan runs it (multinomial, diagonal metric, Stan's warm-up schedule and its metric from the windows' draw variance, or nutpie's from the draws and gradients with `metric-estimate=gradient-scaled`), the waiting chains batched into one call per leapfrog step, on one thread by default (Hoffman & Gelman 2014; Betancourt 2017).";
}

/// Everything that builds an engine: the method with its options, and the kernel and step-size
/// rule it shares with the others.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineSpec {
    /// The method and its own options.
    pub method: MethodConfig,
    /// The kernel, for methods that use one; RBF with the median heuristic by default.
    #[serde(default)]
    pub kernel: KernelConfig,
    /// The step-size rule, for methods that take steps; AdaGrad with momentum by default.
    #[serde(default)]
    pub adapter: AdapterConfig,
}

impl EngineSpec {
    /// The spec of `method` with `kernel` and `adapter`.
    pub fn new(method: MethodConfig, kernel: KernelConfig, adapter: AdapterConfig) -> Self {
        Self { method, kernel, adapter }
    }

    /// The engine; an error names the setting that does not apply to the method.
    pub fn build(&self) -> Result<Box<dyn Engine>, InferError> {
        self.method.config().build(&self.kernel, &self.adapter)
    }
}
