// @ts-check
// The push pacer: a token bucket within the hub's push budget (`sync/budget.py`).

/**
 * At most `rate` messages a second on average, with bursts of up to `burst` (sync/budget.py);
 * times in seconds. The bucket starts full; `take` spends a token if there is one.
 */
class TokenBucket {
  constructor(rate, burst) {
    this.rate = rate;
    this.burst = burst;
    this.tokens = burst;
    this.last = -Infinity;
  }

  #refill(now) {
    if (this.last === -Infinity) this.last = now;
    if (now > this.last) {
      this.tokens = Math.min(this.burst, this.tokens + (now - this.last) * this.rate);
      this.last = now;
    }
  }

  take(now) {
    this.#refill(now);
    if (this.tokens < 1) return false;
    this.tokens -= 1;
    return true;
  }

  readyAt(now) {
    this.#refill(now);
    const missing = 1 - this.tokens;
    return missing <= 0 ? now : now + missing / this.rate;
  }
}

/**
 * The bucket a replica paces its pushes by within the hub's push budget `[rate, burst]`: a
 * tenth slower and half the burst (sync/budget.py `pace`); null for no budget or one no
 * bucket can hold.
 * @param {unknown} budget
 * @returns {TokenBucket | null}
 */
export function pacerFor(budget) {
  if (!Array.isArray(budget) || budget.length !== 2) return null;
  const rate = Number(budget[0]) * 0.9;
  const burst = Math.max(1, Number(budget[1]) / 2);
  if (!(rate > 0 && rate < Infinity && burst >= 1 && burst < Infinity)) return null;
  return new TokenBucket(rate, burst);
}

/** Milliseconds on a monotonic clock where there is one. */
export function monotonicMs() {
  return globalThis.performance?.now?.() ?? Date.now();
}
