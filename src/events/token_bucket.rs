//! A token bucket (golang.org/x/time/rate as client-go's flowcontrol uses it): it starts full
//! with `burst` tokens and refills at `qps` tokens a second, never above `burst`. Time is given
//! by the caller in seconds from any fixed origin, so the same bucket serves a monotonic clock
//! (the API request limit) and an injected one (the spam filter, its tests).

use std::time::Duration;

#[derive(Debug, Clone)]
pub struct TokenBucket {
    qps: f64,
    burst: f64,
    tokens: f64,
    last: f64,
}

impl TokenBucket {
    /// A full bucket at time `now`.
    pub fn new(qps: f64, burst: u32, now: f64) -> TokenBucket {
        TokenBucket {
            qps,
            burst: burst as f64,
            tokens: burst as f64,
            last: now,
        }
    }

    fn refill(&mut self, now: f64) {
        // A clock that went backwards refills nothing (and takes nothing away).
        if now > self.last {
            self.tokens = (self.tokens + (now - self.last) * self.qps).min(self.burst);
            self.last = now;
        }
    }

    /// Take a token if one is there.
    pub fn try_take(&mut self, now: f64) -> bool {
        self.refill(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// How long until a token is there (zero when one is).
    pub fn wait(&mut self, now: f64) -> Duration {
        self.refill(now);
        if self.tokens >= 1.0 || self.qps <= 0.0 {
            return Duration::ZERO;
        }
        Duration::from_secs_f64((1.0 - self.tokens) / self.qps)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bursts_then_refills_at_the_rate() {
        let mut b = TokenBucket::new(1.0 / 300.0, 25, 0.0);
        assert_eq!((0..30).filter(|_| b.try_take(0.0)).count(), 25);
        assert!(!b.try_take(299.0));
        assert!(b.try_take(300.0));
        assert!(!b.try_take(300.0));
        // A long quiet time refills to the burst, not beyond.
        assert_eq!((0..30).filter(|_| b.try_take(1e6)).count(), 25);
    }

    #[test]
    fn wait_is_the_time_to_the_next_token() {
        let mut b = TokenBucket::new(50.0, 1, 0.0);
        assert_eq!(b.wait(0.0), Duration::ZERO);
        assert!(b.try_take(0.0));
        let w = b.wait(0.0);
        assert!((w.as_secs_f64() - 0.02).abs() < 1e-9, "{w:?}");
        assert!(b.try_take(0.02));
    }
}
