// The one-compartment pharmacokinetic model with Michaelis-Menten elimination of
// parvi_models::stan_users::OneCompartmentMm (issue 45, item 5), for scripts/stan_time.py.
functions {
  vector one_cpt_mm(real t, vector y, real ka, real V, real Vm, real Km) {
    vector[2] dydt;
    real c = y[2] / V;
    dydt[1] = -ka * y[1];
    dydt[2] = ka * y[1] - Vm * c / (Km + c);
    return dydt;
  }
}
data {
  int<lower=1> N;
  array[N] real<lower=0> ts;
  real<lower=0> dose;
  vector<lower=0>[N] conc;
}
parameters {
  real<lower=0> ka;
  real<lower=0> V;
  real<lower=0> Vm;
  real<lower=0> Km;
  real<lower=0> sigma;
}
transformed parameters {
  array[N] vector[2] y = ode_bdf(one_cpt_mm, [dose, 0]', 0, ts, ka, V, Vm, Km);
}
model {
  ka ~ lognormal(0, 0.5);
  V ~ lognormal(log(10), 0.3);
  Vm ~ lognormal(log(3), 0.5);
  Km ~ lognormal(0, 0.5);
  sigma ~ normal(0, 0.5);
  for (n in 1:N)
    conc[n] ~ lognormal(log(y[n, 2] / V), sigma);
}
