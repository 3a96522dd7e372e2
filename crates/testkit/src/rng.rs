//! A small deterministic pseudo-random source (xorshift64*) for the
//! randomized loops of the tests: a fixed seed makes every run the same
//! walk, so a failure reproduces, and no dependency is needed.

/// xorshift64* (Vigna): good enough to shuffle test inputs.
pub struct Rng(u64);

impl Rng {
    /// A generator; any seed works (0 is nudged, xorshift would stay 0).
    pub fn new(seed: u64) -> Rng {
        Rng(seed | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        ((self.next_u64() >> 11) % n.max(1) as u64) as usize
    }

    pub fn byte(&mut self) -> u8 {
        (self.next_u64() >> 24) as u8
    }

    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.byte()).collect()
    }

    /// Up to `n - 1` random bytes.
    pub fn bytes_below(&mut self, n: usize) -> Vec<u8> {
        let n = self.below(n);
        self.bytes(n)
    }

    /// One of `from`.
    pub fn pick<'a, T>(&mut self, from: &'a [T]) -> &'a T {
        &from[self.below(from.len())]
    }
}

#[cfg(test)]
mod tests {
    use super::Rng;

    #[test]
    fn a_seed_gives_the_same_walk_and_every_value_comes() {
        let walk = |seed| {
            let mut r = Rng::new(seed);
            (0..64).map(|_| r.below(7)).collect::<Vec<_>>()
        };
        assert_eq!(walk(3), walk(3));
        assert_ne!(walk(3), walk(4));
        let seen: std::collections::BTreeSet<usize> = walk(5).into_iter().collect();
        assert_eq!(seen.len(), 7, "all of 0..7 within 64 draws");
        assert_eq!(Rng::new(0).below(0), 0);
    }
}
