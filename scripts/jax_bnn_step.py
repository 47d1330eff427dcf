#!/usr/bin/env python3
"""The JAX yardstick of `parvi bench speed --only bnn`: a hand-fused, jit-compiled SVGD step of
the same mathematics as parvi's Boston BNN step and its hand-written reference
(crates/parvi-bench/src/handwritten.rs):

- the BNN `inputs -> hidden (ReLU) -> 1`, a particle `[w1 (hidden x inputs, row-major), b1, w2, b2,
  log gamma, log lambda]`; the log-joint with `y ~ N(f(x), 1/gamma)` scaled by rows / batch, every
  weight `~ N(0, 1/lambda)`, `gamma, lambda ~ Gamma(a0 = 1, b0 = 0.1)` on the log scale with the
  Jacobian; scores by `jax.grad`;
- SVGD (Liu & Wang 2016, eq. 8) with the RBF kernel and the median bandwidth
  `h^2 = med / (2 log(n + 1))` over all `n^2` squared distances;
- AdaGrad with momentum: `hist = phi^2` at the first step, then `alpha hist + (1 - alpha) phi^2`;
  `x += lr phi / (fudge + sqrt(hist))`.

Everything of a step (the minibatch gather included) is one jitted function in float32.

Reads a JSON job (`x` rows, `y`, `particles`, `batches` of row indices used in turn, `steps`,
`repeats`, `hidden`, `lr`, `alpha`, `fudge`) from the file named on the command line and prints
one JSON line: the median ms per step over the repeats (after a warm-up repeat that compiles),
the JAX version and device, and the particles after the first `steps` steps from the start (so
the caller can check that this is the same step as its own).

    python3 scripts/jax_bnn_step.py job.json
"""

import json
import sys
import time

A0 = 1.0
B0 = 0.1


def main(path):
    import jax
    import jax.numpy as jnp
    import numpy as np

    jax.config.update("jax_platforms", "cpu")
    with open(path) as f:
        job = json.load(f)
    x = jnp.asarray(np.asarray(job["x"], dtype=np.float32))
    y = jnp.asarray(np.asarray(job["y"], dtype=np.float32))
    start = jnp.asarray(np.asarray(job["particles"], dtype=np.float32))
    batches = jnp.asarray(np.asarray(job["batches"], dtype=np.int32))
    steps, repeats, hidden = int(job["steps"]), int(job["repeats"]), int(job["hidden"])
    lr, alpha, fudge = float(job["lr"]), float(job["alpha"]), float(job["fudge"])
    rows, d = x.shape
    n, dim = start.shape
    h = hidden
    nw = d * h + 2 * h + 1
    assert dim == nw + 2, f"particle dimension {dim} is not a {d}-{h}-1 BNN's {nw + 2}"

    def log_joint(theta, xb, yb):
        """The log-joint of all particles `[n, dim]` on the minibatch, summed over particles."""
        m = n
        w1 = theta[:, : d * h].reshape(m, h, d)
        b1 = theta[:, d * h : d * h + h]
        w2 = theta[:, d * h + h : d * h + 2 * h]
        b2 = theta[:, d * h + 2 * h]
        log_gamma, log_lambda = theta[:, nw], theta[:, nw + 1]
        hid = jax.nn.relu(jnp.einsum("bd,mhd->mbh", xb, w1) + b1[:, None, :])
        f = jnp.einsum("mbh,mh->mb", hid, w2) + b2[:, None]
        b = xb.shape[0]
        scale = rows / b
        ssr = jnp.sum((yb[None, :] - f) ** 2, axis=1)
        gamma, lam = jnp.exp(log_gamma), jnp.exp(log_lambda)
        lik = scale * (0.5 * b * log_gamma - 0.5 * gamma * ssr)
        ssw = jnp.sum(theta[:, :nw] ** 2, axis=1)
        prior_w = 0.5 * nw * log_lambda - 0.5 * lam * ssw
        # Gamma(a0, b0) on gamma and lambda, sampled as logs: a0 u - b0 e^u (Jacobian folded in).
        hyper = A0 * log_gamma - B0 * gamma + A0 * log_lambda - B0 * lam
        return jnp.sum(lik + prior_w + hyper)

    score = jax.grad(log_joint)

    def step(theta, hist, first, idx):
        xb, yb = x[idx], y[idx]
        s = score(theta, xb, yb)
        sq_norms = jnp.sum(theta * theta, axis=1)
        sq = jnp.maximum(sq_norms[:, None] + sq_norms[None, :] - 2.0 * theta @ theta.T, 0.0)
        med = jnp.median(sq)
        h2 = med / (2.0 * jnp.log(n + 1.0))
        h2 = jnp.where(h2 > 0.0, h2, 1.0)
        k = jnp.exp(-sq / (2.0 * h2))
        phi = (k @ s + (jnp.sum(k, axis=1)[:, None] * theta - k @ theta) / h2) / n
        g2 = phi * phi
        hist = jnp.where(first, g2, alpha * hist + (1.0 - alpha) * g2)
        return theta + lr * phi / (fudge + jnp.sqrt(hist)), hist

    step = jax.jit(step)

    def run():
        theta, hist = start, jnp.zeros_like(start)
        for t in range(steps):
            theta, hist = step(theta, hist, t == 0, batches[t % batches.shape[0]])
        theta.block_until_ready()
        return theta

    first_run = run()  # compiles
    times = []
    for _ in range(repeats):
        clock = time.perf_counter()
        run()
        times.append(1e3 * (time.perf_counter() - clock) / steps)
    times.sort()
    print(
        json.dumps(
            {
                "ms_per_step": times[len(times) // 2],
                "jax_version": jax.__version__,
                "device": str(jax.devices()[0]),
                "particles": np.asarray(first_run).tolist(),
            }
        )
    )


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: jax_bnn_step.py JOB.json")
    main(sys.argv[1])
