//! Splits a fuzz input into fields; every read past the end yields zeros
//! or nothing, so any byte string is a valid input.

pub(super) struct Input<'a>(pub(super) &'a [u8]);

impl<'a> Input<'a> {
    pub(super) fn bytes(&mut self, n: usize) -> &'a [u8] {
        let (head, rest) = self.0.split_at(n.min(self.0.len()));
        self.0 = rest;
        head
    }

    pub(super) fn u8(&mut self) -> u8 {
        self.bytes(1).first().copied().unwrap_or(0)
    }

    pub(super) fn u64(&mut self) -> u64 {
        let mut b = [0u8; 8];
        let head = self.bytes(8);
        b[..head.len()].copy_from_slice(head);
        u64::from_le_bytes(b)
    }

    /// A length-prefixed (one byte) piece.
    pub(super) fn piece(&mut self) -> &'a [u8] {
        let n = usize::from(self.u8());
        self.bytes(n)
    }

    pub(super) fn rest(&mut self) -> &'a [u8] {
        self.bytes(self.0.len())
    }

    pub(super) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}
