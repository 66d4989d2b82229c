"""Every generator's mean and coefficient of variation against its closed form.

Samples are large (2 * 10**5 draws) and each tolerance is a few standard errors of the estimate, so a generator
whose mean is off by a few per cent fails: a lognormal without the -sigma^2/2 correction is 41 % high at CV 1
(e^{sigma^2 / 2} = sqrt(2)), far outside. Medians are checked where the mean's tail makes it noisy: a lognormal's
median is mean / sqrt(1 + CV^2) exactly.
"""
import math

import numpy as np
import pytest

import batchlab as bl
from batchlab import workload

N = 200_000


def cv_of(x):
    x = np.asarray(x, dtype=np.float64)
    return x.std() / x.mean()


@pytest.mark.parametrize("mean, cv", [(1000.0, 0.5), (1000.0, 1.0), (4000.0, 1.5)])
def test_lognormal_lengths_have_the_asked_mean_cv_and_median(mean, cv):
    x = bl.lengths_lognormal(N, mean, cv, seed=11)
    se_mean = cv / math.sqrt(N)  # relative standard error of the sample mean
    assert x.mean() == pytest.approx(mean, rel=6 * se_mean)
    # The median exp(mu) = mean / sqrt(1 + cv^2): the -sigma^2/2 correction in mu; robust to the tail.
    assert np.median(x) == pytest.approx(mean / math.sqrt(1 + cv * cv), rel=0.015)
    sigma2 = math.log1p(cv * cv)
    kurtosis = math.exp(4 * sigma2) + 2 * math.exp(3 * sigma2) + 3 * math.exp(2 * sigma2) - 3
    se_cv = cv * math.sqrt((kurtosis - 1) / (4 * N)) + se_mean  # delta method on the standard deviation
    assert cv_of(x) == pytest.approx(cv, abs=6 * se_cv * cv + 0.005)


def test_lognormal_with_cv_0_is_the_rounded_mean_exactly():
    np.testing.assert_array_equal(bl.lengths_lognormal(5, 99.5, 0.0), np.full(5, 100))
    np.testing.assert_array_equal(bl.lengths_lognormal(5, 1234.0, 0.0), np.full(5, 1234))


def test_lognormal_clip_is_exact():
    x = bl.lengths_lognormal(N, 1000.0, 2.0, seed=3, max_tokens=2000)
    assert x.max() == 2000 and x.min() >= 1 and (x == 2000).mean() > 0.05


@pytest.mark.parametrize("low, high", [(1, 1), (10, 20), (1, 4096)])
def test_uniform_lengths_mean_and_cv(low, high):
    x = bl.lengths_uniform(N, low, high, seed=5)
    mean = (low + high) / 2
    sd = math.sqrt(((high - low + 1) ** 2 - 1) / 12)  # discrete uniform
    assert x.min() == low and x.max() == high
    assert x.mean() == pytest.approx(mean, abs=6 * sd / math.sqrt(N) + 1e-12)
    assert x.std() == pytest.approx(sd, abs=0.01 * sd + 1e-12)


def test_empirical_lengths_mean_and_cv_follow_the_quantile_table():
    """Inverse CDF linear between equally spaced quantiles: each of the k - 1 segments is a uniform on
    [q_i, q_{i+1}] with probability 1 / (k - 1), so E X = mean of (q_i + q_{i+1}) / 2 and E X^2 = mean of
    (q_i^2 + q_i q_{i+1} + q_{i+1}^2) / 3 (rounding to whole tokens adds 1/12 to the variance)."""
    q = np.array([1.0, 40.0, 100.0, 300.0, 2000.0])
    a, b = q[:-1], q[1:]
    mean = ((a + b) / 2).mean()
    var = ((a * a + a * b + b * b) / 3).mean() - mean**2 + 1 / 12
    x = bl.lengths_empirical(N, q, seed=9)
    assert x.min() == 1 and x.max() <= 2000
    assert x.mean() == pytest.approx(mean, abs=6 * math.sqrt(var / N))
    assert x.std() == pytest.approx(math.sqrt(var), rel=0.01)


@pytest.mark.parametrize("rate, cv", [(10.0, 1.0), (2.5, 0.5), (40.0, 2.0)])
def test_gamma_arrivals_gap_mean_and_cv(rate, cv):
    t = bl.arrivals_gamma(N, rate, cv, seed=13)
    gaps = np.diff(t)
    assert t[0] == 0.0 and (gaps >= 0).all()
    assert gaps.mean() == pytest.approx(1 / rate, rel=6 * cv / math.sqrt(N))
    # Gamma with shape k = 1 / cv^2: the sample CV's standard error from its kurtosis 3 + 6 / k.
    se_cv = cv * math.sqrt((2 + 6 * cv * cv) / (4 * N)) + cv / math.sqrt(N)
    assert cv_of(gaps) == pytest.approx(cv, abs=6 * se_cv)


def test_poisson_arrivals_are_gamma_with_cv_1():
    np.testing.assert_array_equal(bl.arrivals_poisson(1000, 7.0, seed=4), bl.arrivals_gamma(1000, 7.0, 1.0, seed=4))
    gaps = np.diff(bl.arrivals_poisson(N, 7.0, seed=4))
    assert gaps.mean() == pytest.approx(1 / 7.0, rel=6 / math.sqrt(N))
    assert cv_of(gaps) == pytest.approx(1.0, abs=0.02)


def test_evenly_spaced_and_simultaneous_arrivals_are_exact():
    np.testing.assert_allclose(bl.arrivals_gamma(5, 4.0, 0.0), [0.0, 0.25, 0.5, 0.75, 1.0], rtol=0, atol=1e-15)
    np.testing.assert_array_equal(bl.arrivals_gamma(5, math.inf, 3.0), np.zeros(5))


def test_synthetic_combines_the_three_generators():
    r = bl.synthetic(N, 800.0, 200.0, prompt_cv=1.0, output_cv=0.5, rate_req_s=20.0, arrival_cv=2.0, seed=21)
    assert r.prompt_tokens.mean() == pytest.approx(800.0, rel=6 / math.sqrt(N))
    assert np.median(r.prompt_tokens) == pytest.approx(800.0 / math.sqrt(2), rel=0.015)
    assert r.output_tokens.mean() == pytest.approx(200.0, rel=6 * 0.5 / math.sqrt(N))
    assert cv_of(r.output_tokens) == pytest.approx(0.5, abs=0.01)
    gaps = np.diff(r.arrival_s)
    assert gaps.mean() == pytest.approx(1 / 20.0, rel=6 * 2.0 / math.sqrt(N))
    assert cv_of(gaps) == pytest.approx(2.0, abs=0.05)


def test_fixed_is_exact():
    r = bl.fixed(7, 300, 40, rate_req_s=math.inf)
    assert (r.prompt_tokens == 300).all() and (r.output_tokens == 40).all() and (r.arrival_s == 0).all()


@pytest.mark.parametrize("name", ["azure-conv-2023", "sharegpt"])
def test_preset_length_means_follow_the_quantile_table(name):
    """A preset draws lengths by the empirical inverse CDF of its 101 quantiles: the mean is the trapezoid mean of
    the table (within rounding to whole tokens), and the gaps have the table's mean and CV."""
    row = workload._preset_row(name)
    r = bl.preset(name, N, seed=17)
    for col, x in (("prompt_tokens", r.prompt_tokens), ("output_tokens", r.output_tokens)):
        q = workload._preset_quantiles(row, col)
        mean = ((q[:-1] + q[1:]) / 2).mean()
        assert x.mean() == pytest.approx(mean, rel=6 * cv_of(x) / math.sqrt(N) + 1e-3), col
    gaps = np.diff(r.arrival_s)
    cv = float(row["interarrival_cv"])
    assert gaps.mean() == pytest.approx(1 / float(row["rate_req_per_s"]), rel=6 * cv / math.sqrt(N))
    assert cv_of(gaps) == pytest.approx(cv, rel=0.05)


def test_shared_prefix_and_multi_turn_lengths_are_exact():
    s = bl.shared_prefix(24, n_groups=3, prompts_per_group=4, system_prompt_tokens=100, question_tokens=20,
                         output_tokens=8)
    assert (s.prompt_tokens == 120).all() and (s.output_tokens == 8).all()
    m = bl.multi_turn(2, 3, system_prompt_tokens=50, user_tokens=10, output_tokens=5, turn_gap_s=4.0)
    # Turn k's prompt: system + (user + answer) * (k - 1) + user = 60, 75, 90, for each of two conversations.
    assert sorted(m.prompt_tokens.tolist()) == [60, 60, 75, 75, 90, 90] and (m.output_tokens == 5).all()
