// The Stan program that src/main.rs writes in parvi's DSL (for comparison with Stan).
data {
  int<lower=1> N;
  array[N] int y;             // counts: poisson_log refuses a negative one
  vector[N] x;
  real<lower=0> prior_scale;  // the coefficients' prior sd: normal refuses 0
}
transformed data {
  real x_mean = mean(x);
  real x_sd = sd(x);
  vector[N] z = (x - x_mean) / x_sd;
}
parameters {
  vector[2] beta;
}
model {
  beta ~ normal(0, prior_scale);
  y ~ poisson_log(beta[1] + beta[2] * z);
}
generated quantities {
  real slope = beta[2] / x_sd;  // per unit of x
}
