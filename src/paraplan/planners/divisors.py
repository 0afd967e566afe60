"""The divisors of a batch: every whole micro-batch count (planners/request.py re-exports them).

One implementation for the planners and the lower bound (planners/bound.py), by factoring: the work
grows with the number of digits of the batch, never with its value.
"""

from __future__ import annotations

from math import gcd


def divisors(n: int) -> tuple[int, ...]:
    """The divisors of n >= 1, ascending (the candidate micro-batch counts of a batch n).

    From n's prime factors, so the work grows with the number of digits, not with n: a global
    batch of 10**12 is as legal as one of 8 (counting to n took hours there). Their count is small
    for any batch (at most 6,720 below 10**12, 103,680 below 10**18).
    """
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"divisors: expected a positive whole number, got {n!r}")
    result = [1]
    for prime, power in sorted(prime_factors(n).items()):
        result = [d * prime**e for d in result for e in range(power + 1)]
    return tuple(sorted(result))


def prime_factors(n: int) -> dict[int, int]:
    """{prime: exponent} of n >= 1: trial division by the small primes, then Pollard's rho (Brent)
    on what is left, with a Miller-Rabin test deciding when a factor is prime. Trial division alone
    would take sqrt(n) steps on a large prime factor (10**9 for a batch near 10**18)."""
    factors: dict[int, int] = {}
    for p in _SMALL_PRIMES:
        while n % p == 0:
            factors[p] = factors.get(p, 0) + 1
            n //= p
    stack = [n] if n > 1 else []
    while stack:
        m = stack.pop()
        if _is_prime(m):
            factors[m] = factors.get(m, 0) + 1
        else:
            d = _pollard_brent(m)
            stack += [d, m // d]
    return factors


_SMALL_PRIMES = tuple(p for p in range(2, 1000) if all(p % q for q in range(2, int(p**0.5) + 1)))
# Miller-Rabin with the first 13 primes as bases is exact below 3.3 * 10**24; above, a composite
# passing all 13 is not known to exist
_WITNESSES = _SMALL_PRIMES[:13]


def _is_prime(n: int) -> bool:
    if n < 2:
        return False
    if n in _WITNESSES:
        return True
    if any(n % p == 0 for p in _WITNESSES):
        return False
    d, s = n - 1, 0
    while d % 2 == 0:
        d, s = d // 2, s + 1
    for a in _WITNESSES:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(s - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def _pollard_brent(n: int) -> int:
    """A non-trivial factor of a composite n with no factor below 1000 (Brent's variant of Pollard's
    rho: about n**(1/4) steps for n's smallest prime factor)."""
    for c in range(1, n):  # a cycle without a factor (rare) tries the next polynomial x^2 + c
        y, r, q, g, x, ys = 2, 1, 1, 1, 2, 2
        while g == 1:
            x = y
            for _ in range(r):
                y = (y * y + c) % n
            k = 0
            while k < r and g == 1:
                ys = y
                for _ in range(min(128, r - k)):
                    y = (y * y + c) % n
                    q = q * abs(x - y) % n
                g = gcd(q, n)
                k += 128
            r *= 2
        if g == n:  # the batched product overshot: step back one at a time
            g = 1
            while g == 1:
                ys = (ys * ys + c) % n
                g = gcd(abs(x - ys), n)
        if g != n:
            return g
    raise ValueError(f"no factor found for {n}")  # unreachable for a composite n


def choices_near(n: int, value: int, most: int = 12) -> str:
    """'choose from 1, 2, 4, 8' for a message about a count that does not divide n; with more
    divisors than `most` (a batch of 10**18 has 103,680), the ones nearest `value`, so that the
    message stays one readable line."""
    options = divisors(n)
    if len(options) <= most:
        return f"choose from {', '.join(map(str, options))}"
    nearest = sorted(sorted(options, key=lambda d: (abs(d - value), d))[:4])
    return f"the nearest of its {len(options):,} divisors: {', '.join(map(str, nearest))}"
