//! [`TensorBlocks`]: an all-to-all's blocks as byte ranges of the caller's
//! tensors, for the all-to-all algorithms (pairwise over the transport,
//! through the shared-memory arena), which read and write them in place
//! instead of staging them whole.
//!
//! Blocks are read straight from contiguous inputs and written straight
//! into contiguous outputs. No block read shares storage with a block
//! written (see below), so an algorithm may write one while it reads
//! another. An input of another layout is copied once into a contiguous
//! tensor first; an output of another layout gets a contiguous stand-in
//! that [`TensorBlocks::finish`] copies back. When an
//! output shares storage with an input, every input is copied first, so
//! that results arriving early never overwrite data still to be sent.

use std::ops::Range;

use crate::cpu::algorithms::ExchangeBlocks;
use crate::tensor::Tensor;
use crate::Result;

/// A block: a tensor (contiguous) and the bytes of it that make the block;
/// `None` for an empty one.
type Block = Option<(Tensor<'static>, Range<usize>)>;

/// One rank's blocks of an all-to-all (see the module docs).
pub(super) struct TensorBlocks {
    sends: Vec<Block>,
    recvs: Vec<Block>,
    /// Outputs that are not contiguous, each with the stand-in written
    /// in its place.
    stand_ins: Vec<(Tensor<'static>, Tensor<'static>)>,
}

impl TensorBlocks {
    /// Blocks of `inputs[p]` and `outputs[p]`, each whole, for rank `p`.
    pub(super) fn lists(inputs: &[Tensor<'static>], outputs: &[Tensor<'static>]) -> Result<Self> {
        let sends: Vec<_> = inputs.iter().map(Some).collect();
        let recvs: Vec<_> = outputs.iter().map(Some).collect();
        Self::whole(&sends, &recvs)
    }

    /// Blocks of whole tensors: `sends[p]` to rank `p`, `recvs[p]` from
    /// it, `None` where nothing moves (the rooted collectives: gather,
    /// scatter).
    pub(super) fn whole(
        sends: &[Option<&Tensor<'static>>],
        recvs: &[Option<&Tensor<'static>>],
    ) -> Result<Self> {
        let aliased = recvs
            .iter()
            .flatten()
            .any(|o| sends.iter().flatten().any(|i| o.shares_storage(i)));
        let whole = |t: Tensor<'static>| {
            let n = t.nbytes();
            Some((t, 0..n))
        };
        let mut blocks = TensorBlocks {
            sends: Vec::with_capacity(sends.len()),
            recvs: Vec::with_capacity(recvs.len()),
            stand_ins: Vec::new(),
        };
        for input in sends {
            let block = match input {
                Some(t) => whole(readable(t, aliased)?),
                None => None,
            };
            blocks.sends.push(block);
        }
        for output in recvs {
            let block = match output {
                Some(t) => whole(blocks.writable(t)?),
                None => None,
            };
            blocks.recvs.push(block);
        }
        Ok(blocks)
    }

    /// Blocks of one input and one output cut at byte offsets (`world + 1`
    /// each): block `p` is `send_offsets[p]..send_offsets[p + 1]`.
    pub(super) fn single(
        input: &Tensor<'static>,
        send_offsets: &[usize],
        output: &Tensor<'static>,
        recv_offsets: &[usize],
    ) -> Result<Self> {
        let mut blocks = TensorBlocks {
            sends: Vec::new(),
            recvs: Vec::new(),
            stand_ins: Vec::new(),
        };
        let input = readable(input, output.shares_storage(input))?;
        let output = blocks.writable(output)?;
        blocks.sends = send_offsets
            .windows(2)
            .map(|w| Some((input.clone(), w[0]..w[1])))
            .collect();
        blocks.recvs = recv_offsets
            .windows(2)
            .map(|w| Some((output.clone(), w[0]..w[1])))
            .collect();
        Ok(blocks)
    }

    /// `output` itself when contiguous, else a contiguous stand-in that
    /// [`finish`](Self::finish) copies back.
    fn writable(&mut self, output: &Tensor<'static>) -> Result<Tensor<'static>> {
        if output.is_contiguous() {
            return Ok(output.clone());
        }
        let stand_in = Tensor::zeros(output.shape(), output.dtype())?;
        self.stand_ins.push((output.clone(), stand_in.clone()));
        Ok(stand_in)
    }

    /// Copies the stand-ins into the outputs they stand for.
    pub(super) fn finish(self) -> Result<()> {
        for (output, stand_in) in &self.stand_ins {
            output.copy_from(stand_in)?;
        }
        Ok(())
    }
}

/// `input` itself when contiguous and not `aliased` by an output, else a
/// contiguous copy of it.
fn readable(input: &Tensor<'static>, aliased: bool) -> Result<Tensor<'static>> {
    if input.is_contiguous() && !aliased {
        Ok(input.clone())
    } else {
        input.contiguous()
    }
}

/// The tensor and bytes `range` of `block` stand for; none for an empty
/// block (which is only ever asked for nothing).
fn within(block: &Block, range: Range<usize>) -> Option<(&Tensor<'static>, Range<usize>)> {
    block
        .as_ref()
        .map(|(t, r)| (t, r.start + range.start..r.start + range.end))
}

/// The length of `block`.
fn len(block: &Block) -> usize {
    block.as_ref().map_or(0, |(_, r)| r.len())
}

impl ExchangeBlocks for TensorBlocks {
    fn send_len(&self, peer: usize) -> usize {
        len(&self.sends[peer])
    }

    fn recv_len(&self, peer: usize) -> usize {
        len(&self.recvs[peer])
    }

    fn read(&self, peer: usize, range: Range<usize>, f: &mut dyn FnMut(&[u8])) -> Result<()> {
        match within(&self.sends[peer], range) {
            Some((t, bytes)) => t.with_bytes(|b| f(&b[bytes])),
            None => {
                f(&[]);
                Ok(())
            }
        }
    }

    fn write(&self, peer: usize, range: Range<usize>, f: &mut dyn FnMut(&mut [u8])) -> Result<()> {
        match within(&self.recvs[peer], range) {
            Some((t, bytes)) => t.with_bytes_mut(|b| f(&mut b[bytes])),
            None => {
                f(&mut []);
                Ok(())
            }
        }
    }
}
