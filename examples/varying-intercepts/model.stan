// The Stan program that src/main.rs writes in parvi's DSL (for comparison with Stan).
data {
  int<lower=1> N;
  int<lower=1> J;
  array[N] int<lower=1, upper=J> group;
  vector[N] x;
  vector[N] y;
}
parameters {
  real mu;
  real<lower=0> tau;
  vector[J] eta;
  real beta;
  real<lower=0> sigma;
}
transformed parameters {
  vector[J] alpha = mu + tau * eta;
}
model {
  mu ~ normal(0, 5);
  tau ~ normal(0, 2);
  eta ~ std_normal();
  beta ~ normal(0, 2);
  sigma ~ exponential(1);
  y ~ normal(alpha[group] + beta * x, sigma);
}
generated quantities {
  array[N] real y_rep = normal_rng(alpha[group] + beta * x, sigma);
  vector[N] log_lik;
  for (i in 1:N) log_lik[i] = normal_lpdf(y[i] | alpha[group[i]] + beta * x[i], sigma);
}
