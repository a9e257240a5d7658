//! gRPC over a unix socket for clients that name the socket path as the HTTP/2 `:authority`.
//!
//! grpc-go dialled with a bare path and a context dialer — the way the kubelet's plugin watcher
//! reaches every socket in `plugins_registry` — sends that path (`/var/lib/kubelet/...sock`) as
//! `:authority`. h2, under tonic, accepts only a URI authority there and resets the stream with
//! PROTOCOL_ERROR, so the kubelet never learns that our DRA driver exists (hyperium/h2#487 is
//! open and h2 has no switch for it). Every gRPC socket the runtime serves therefore reads its
//! client's bytes through [`Lenient`]: HTTP/2 frames pass unchanged except header blocks, which
//! are decoded with the client's HPACK context and encoded again with one of ours, an authority
//! that is not a URI authority replaced by `localhost` (what grpc-go itself sends for `unix:`
//! targets). What we answer passes untouched.
//!
//! The kubelet emulator runs the same [`Rewriter`] on its writes, the other way round, so the
//! fast tier dials exactly as the real kubelet does.

use std::borrow::Cow;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use loona_hpack::{Decoder, Encoder};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{UnixListener, UnixStream};
use tokio_stream::{Stream, StreamExt, wrappers::UnixListenerStream};

/// The connection preface every HTTP/2 client sends before its first frame.
const PREFACE_LEN: usize = 24;
const FRAME_HEADER_LEN: usize = 9;
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// The frame size every HTTP/2 peer must accept (SETTINGS_MAX_FRAME_SIZE's floor); the
/// blocks we encode again are cut to it so no setting of the server's needs tracking.
const MIN_MAX_FRAME: usize = 16_384;
/// The largest frame we buffer: larger ones pass through unread only when they are not
/// header frames; a header frame this large is refused (gRPC metadata is a few hundred bytes).
const MAX_HEADER_FRAME: usize = 1 << 20;
/// The most bytes one header block (HEADERS plus CONTINUATIONs) may carry, encoded or decoded.
const MAX_BLOCK: usize = 1 << 20;
/// HPACK's default dynamic table size: what h2 advertises, so what the client may use.
const TABLE_SIZE: usize = 4_096;

/// Why a client's byte stream could not be carried over.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RewriteError {
    #[error(
        "header frame of {len} bytes on stream {stream} exceeds the {MAX_HEADER_FRAME}-byte bound"
    )]
    FrameTooLarge { stream: u32, len: usize },
    #[error("header block on stream {stream} exceeds the {MAX_BLOCK}-byte bound")]
    BlockTooLarge { stream: u32 },
    #[error("frame type {kind:#x} on stream {stream} inside the header block of stream {open}")]
    Interleaved { kind: u8, stream: u32, open: u32 },
    #[error("CONTINUATION on stream {stream} with no header block open")]
    StrayContinuation { stream: u32 },
    #[error("padding of {pad} bytes on stream {stream} is longer than its frame")]
    BadPadding { stream: u32, pad: usize },
    #[error("HPACK block on stream {stream} does not decode: {reason:?}")]
    Hpack {
        stream: u32,
        reason: loona_hpack::decoder::DecoderError,
    },
}

impl From<RewriteError> for io::Error {
    fn from(e: RewriteError) -> Self {
        io::Error::new(io::ErrorKind::InvalidData, e)
    }
}

/// What to do with one `:authority` value: `Some(new)` replaces it.
pub(crate) type AuthorityFix = Box<dyn Fn(&[u8]) -> Option<Vec<u8>> + Send + Sync>;

/// The server side's rule: an authority h2 would refuse becomes `localhost`.
pub(crate) fn lenient_authority() -> AuthorityFix {
    Box::new(|value| {
        http::uri::Authority::try_from(value)
            .is_err()
            .then(|| b"localhost".to_vec())
    })
}

/// A header block being gathered across HEADERS and CONTINUATION frames.
struct Block {
    stream: u32,
    end_stream: bool,
    priority: Option<[u8; 5]>,
    fragment: Vec<u8>,
}

/// Carries one direction of an HTTP/2 client's byte stream, re-encoding its header blocks.
pub(crate) struct Rewriter {
    fix: AuthorityFix,
    decoder: Decoder<'static>,
    encoder: Encoder<'static>,
    /// Bytes received and not yet carried.
    pending: Vec<u8>,
    /// Preface bytes still to pass.
    preface_left: usize,
    /// Bytes of a non-header frame's payload still to pass verbatim.
    passing: usize,
    block: Option<Block>,
}

impl Rewriter {
    pub(crate) fn new(fix: AuthorityFix) -> Self {
        let mut decoder = Decoder::new();
        decoder.set_max_allowed_table_size(TABLE_SIZE);
        let mut encoder = Encoder::new();
        encoder.set_max_table_size(TABLE_SIZE);
        Self {
            fix,
            decoder,
            encoder,
            pending: Vec::new(),
            preface_left: PREFACE_LEN,
            passing: 0,
            block: None,
        }
    }

    /// Take `input` and append to `out` every byte that can be carried so far.
    pub(crate) fn feed(&mut self, input: &[u8], out: &mut Vec<u8>) -> Result<(), RewriteError> {
        // Only a frame cut by the read is kept between calls; whole frames (the usual read)
        // are carried straight from `input`, never copied into the buffer first.
        let mut kept = std::mem::take(&mut self.pending);
        let data: &[u8] = if kept.is_empty() {
            input
        } else {
            kept.extend_from_slice(input);
            &kept
        };
        let mut at = 0;
        let result = self.carry(data, &mut at, out);
        let tail = data[at..].to_vec();
        kept.clear();
        kept.extend_from_slice(&tail);
        self.pending = kept;
        result
    }

    fn carry(
        &mut self,
        data: &[u8],
        at: &mut usize,
        out: &mut Vec<u8>,
    ) -> Result<(), RewriteError> {
        loop {
            let rest = &data[*at..];
            if self.preface_left > 0 || self.passing > 0 {
                let left = self.preface_left.max(self.passing);
                let n = left.min(rest.len());
                if n == 0 {
                    return Ok(());
                }
                out.extend_from_slice(&rest[..n]);
                *at += n;
                if self.preface_left > 0 {
                    self.preface_left -= n;
                } else {
                    self.passing -= n;
                }
                continue;
            }
            let Some(header) = rest.get(..FRAME_HEADER_LEN) else {
                return Ok(());
            };
            let len =
                usize::from(header[0]) << 16 | usize::from(header[1]) << 8 | usize::from(header[2]);
            let (kind, flags) = (header[3], header[4]);
            let stream =
                u32::from_be_bytes([header[5], header[6], header[7], header[8]]) & 0x7fff_ffff;
            if kind != HEADERS && kind != CONTINUATION {
                if let Some(open) = &self.block {
                    return Err(RewriteError::Interleaved {
                        kind,
                        stream,
                        open: open.stream,
                    });
                }
                out.extend_from_slice(header);
                *at += FRAME_HEADER_LEN;
                self.passing = len;
                continue;
            }
            if len > MAX_HEADER_FRAME {
                return Err(RewriteError::FrameTooLarge { stream, len });
            }
            let Some(payload) = rest.get(FRAME_HEADER_LEN..FRAME_HEADER_LEN + len) else {
                return Ok(());
            };
            *at += FRAME_HEADER_LEN + len;
            self.header_frame(kind, flags, stream, payload)?;
            if flags & END_HEADERS != 0 {
                self.finish(out)?;
            }
        }
    }

    /// Add one HEADERS or CONTINUATION frame's fragment to the open block.
    fn header_frame(
        &mut self,
        kind: u8,
        flags: u8,
        stream: u32,
        payload: &[u8],
    ) -> Result<(), RewriteError> {
        match (kind, &mut self.block) {
            (HEADERS, None) => {
                let mut body = payload;
                let mut pad = 0;
                if flags & PADDED != 0 {
                    let (&p, tail) = body
                        .split_first()
                        .ok_or(RewriteError::BadPadding { stream, pad: 1 })?;
                    pad = usize::from(p);
                    body = tail;
                }
                let mut priority = None;
                if flags & PRIORITY != 0 {
                    let (p, tail) = body
                        .split_first_chunk::<5>()
                        .ok_or(RewriteError::BadPadding { stream, pad })?;
                    priority = Some(*p);
                    body = tail;
                }
                let keep = body
                    .len()
                    .checked_sub(pad)
                    .ok_or(RewriteError::BadPadding { stream, pad })?;
                self.block = Some(Block {
                    stream,
                    end_stream: flags & END_STREAM != 0,
                    priority,
                    fragment: body[..keep].to_vec(),
                });
                Ok(())
            }
            (HEADERS, Some(open)) => Err(RewriteError::Interleaved {
                kind,
                stream,
                open: open.stream,
            }),
            (_, Some(open)) if open.stream == stream => {
                if open.fragment.len() + payload.len() > MAX_BLOCK {
                    return Err(RewriteError::BlockTooLarge { stream });
                }
                open.fragment.extend_from_slice(payload);
                Ok(())
            }
            (_, Some(open)) => Err(RewriteError::Interleaved {
                kind,
                stream,
                open: open.stream,
            }),
            (_, None) => Err(RewriteError::StrayContinuation { stream }),
        }
    }

    /// Decode the finished block, fix its authority, encode it again as HEADERS (+ CONTINUATION).
    fn finish(&mut self, out: &mut Vec<u8>) -> Result<(), RewriteError> {
        let Some(block) = self.block.take() else {
            return Ok(());
        };
        let stream = block.stream;
        let mut fields: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        let mut size = 0usize;
        let fix = &self.fix;
        self.decoder
            .decode_with_cb(&block.fragment, |name: Cow<[u8]>, value: Cow<[u8]>| {
                size += name.len() + value.len();
                let value = match (&*name == b":authority").then(|| fix(&value)).flatten() {
                    Some(fixed) => fixed,
                    None => value.into_owned(),
                };
                fields.push((name.into_owned(), value));
            })
            .map_err(|reason| RewriteError::Hpack { stream, reason })?;
        if size > MAX_BLOCK {
            return Err(RewriteError::BlockTooLarge { stream });
        }
        let encoded = self
            .encoder
            .encode(fields.iter().map(|(n, v)| (n.as_slice(), v.as_slice())));
        let first_room = MIN_MAX_FRAME - block.priority.map_or(0, |_| 5);
        let (first, mut rest) = encoded.split_at(encoded.len().min(first_room));
        let mut flags = if block.end_stream { END_STREAM } else { 0 };
        if block.priority.is_some() {
            flags |= PRIORITY;
        }
        if rest.is_empty() {
            flags |= END_HEADERS;
        }
        let prio: &[u8] = block.priority.as_ref().map_or(&[], |p| p.as_slice());
        write_frame(out, HEADERS, flags, stream, &[prio, first]);
        while !rest.is_empty() {
            let (chunk, tail) = rest.split_at(rest.len().min(MIN_MAX_FRAME));
            rest = tail;
            let flags = if rest.is_empty() { END_HEADERS } else { 0 };
            write_frame(out, CONTINUATION, flags, stream, &[chunk]);
        }
        Ok(())
    }
}

fn write_frame(out: &mut Vec<u8>, kind: u8, flags: u8, stream: u32, parts: &[&[u8]]) {
    let len: usize = parts.iter().map(|p| p.len()).sum();
    // Each part is bounded by MIN_MAX_FRAME above, so the length fits 24 bits.
    let len = u32::try_from(len).unwrap_or(u32::MAX).to_be_bytes();
    out.extend_from_slice(&len[1..]);
    out.extend_from_slice(&[kind, flags]);
    out.extend_from_slice(&stream.to_be_bytes());
    for p in parts {
        out.extend_from_slice(p);
    }
}

/// The connections a gRPC server takes from `listener`, each read leniently.
pub(crate) fn incoming(
    listener: UnixListener,
) -> impl Stream<Item = io::Result<Lenient<UnixStream>>> {
    UnixListenerStream::new(listener).map(|conn| conn.map(Lenient::server))
}

/// Which side of the stream the rewriter sits on.
enum Side {
    /// Rewrite what is read (a server reading its client).
    Reads,
    /// Rewrite what is written (a client dialling a server): the test kubelet's DRA side.
    #[cfg_attr(not(feature = "testkit"), allow(dead_code))]
    Writes,
}

/// An IO stream that carries one of its directions through a [`Rewriter`].
pub(crate) struct Lenient<S> {
    inner: S,
    side: Side,
    rewriter: Rewriter,
    /// Carried bytes not yet handed on (to the reader, or to `inner` for writes).
    ready: Vec<u8>,
    taken: usize,
}

impl<S> Lenient<S> {
    /// A served connection: the client's header blocks are read leniently.
    pub(crate) fn server(inner: S) -> Self {
        Self::with(inner, Side::Reads, lenient_authority())
    }

    /// A dialled connection whose header blocks are written with `fix` applied.
    #[cfg(any(test, feature = "testkit"))]
    pub(crate) fn client(inner: S, fix: AuthorityFix) -> Self {
        Self::with(inner, Side::Writes, fix)
    }

    fn with(inner: S, side: Side, fix: AuthorityFix) -> Self {
        Self {
            inner,
            side,
            rewriter: Rewriter::new(fix),
            ready: Vec::new(),
            taken: 0,
        }
    }

    fn drained(&mut self) {
        if self.taken == self.ready.len() {
            self.ready.clear();
            self.taken = 0;
        }
    }
}

impl<S: AsyncWrite + Unpin> Lenient<S> {
    /// Push carried write bytes on to `inner`; Ready once none are left.
    fn poll_push(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.taken < self.ready.len() {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &self.ready[self.taken..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.taken += n;
        }
        self.drained();
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Lenient<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if matches!(this.side, Side::Writes) {
            return Pin::new(&mut this.inner).poll_read(cx, buf);
        }
        loop {
            if this.taken < this.ready.len() {
                let n = buf.remaining().min(this.ready.len() - this.taken);
                buf.put_slice(&this.ready[this.taken..this.taken + n]);
                this.taken += n;
                this.drained();
                return Poll::Ready(Ok(()));
            }
            let mut raw = [0u8; 8_192];
            let mut raw_buf = ReadBuf::new(&mut raw);
            ready!(Pin::new(&mut this.inner).poll_read(cx, &mut raw_buf))?;
            if raw_buf.filled().is_empty() {
                return Poll::Ready(Ok(()));
            }
            this.rewriter.feed(raw_buf.filled(), &mut this.ready)?;
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Lenient<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if matches!(this.side, Side::Reads) {
            return Pin::new(&mut this.inner).poll_write(cx, data);
        }
        // Earlier bytes first, so the stream keeps its order; then take all of `data`.
        ready!(this.poll_push(cx))?;
        this.rewriter.feed(data, &mut this.ready)?;
        // What could not go now goes on the next write or flush.
        if let Poll::Ready(Err(e)) = this.poll_push(cx) {
            return Poll::Ready(Err(e));
        }
        Poll::Ready(Ok(data.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_push(cx))?;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_push(cx))?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

impl<S: tonic::transport::server::Connected> tonic::transport::server::Connected for Lenient<S> {
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn preface() -> Vec<u8> {
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec()
    }

    fn headers_frame(enc: &mut Encoder<'_>, stream: u32, authority: &[u8], flags: u8) -> Vec<u8> {
        let fields: [(&[u8], &[u8]); 4] = [
            (b":method", b"POST"),
            (b":scheme", b"http"),
            (b":path", b"/pluginregistration.Registration/GetInfo"),
            (b":authority", authority),
        ];
        let block = enc.encode(fields);
        let mut out = Vec::new();
        write_frame(&mut out, HEADERS, flags | END_HEADERS, stream, &[&block]);
        out
    }

    fn decode_headers(dec: &mut Decoder<'_>, frames: &[u8]) -> Vec<Vec<(Vec<u8>, Vec<u8>)>> {
        let mut at = 0;
        let mut blocks = Vec::new();
        let mut open: Vec<u8> = Vec::new();
        while at + FRAME_HEADER_LEN <= frames.len() {
            let len = usize::from(frames[at]) << 16
                | usize::from(frames[at + 1]) << 8
                | usize::from(frames[at + 2]);
            let (kind, flags) = (frames[at + 3], frames[at + 4]);
            let body = &frames[at + FRAME_HEADER_LEN..at + FRAME_HEADER_LEN + len];
            if kind == HEADERS || kind == CONTINUATION {
                let skip = if kind == HEADERS && flags & PRIORITY != 0 {
                    5
                } else {
                    0
                };
                open.extend_from_slice(&body[skip..]);
                if flags & END_HEADERS != 0 {
                    blocks.push(
                        dec.decode(&open)
                            .unwrap_or_else(|e| panic!("decode: {e:?}")),
                    );
                    open.clear();
                }
            }
            at += FRAME_HEADER_LEN + len;
        }
        blocks
    }

    fn authority(block: &[(Vec<u8>, Vec<u8>)]) -> String {
        let (_, v) = block
            .iter()
            .find(|(n, _)| n == b":authority")
            .unwrap_or_else(|| panic!("no authority"));
        String::from_utf8_lossy(v).into_owned()
    }

    #[test]
    fn a_path_authority_reaches_the_server_as_localhost_and_a_valid_one_unchanged() {
        let mut client = Encoder::new();
        let mut input = preface();
        input.extend(headers_frame(
            &mut client,
            1,
            b"/var/lib/kubelet/plugins_registry/gpu.sock",
            0,
        ));
        // A DATA frame between requests passes verbatim.
        write_frame(&mut input, 0x0, END_STREAM, 1, &[b"\0\0\0\0\0"]);
        input.extend(headers_frame(
            &mut client,
            3,
            b"/var/lib/kubelet/plugins_registry/gpu.sock",
            0,
        ));
        input.extend(headers_frame(&mut client, 5, b"node-a:10250", END_STREAM));
        let mut rw = Rewriter::new(lenient_authority());
        let mut out = Vec::new();
        // One byte at a time: frames split anywhere still come out whole and in order.
        for b in &input {
            rw.feed(std::slice::from_ref(b), &mut out)
                .unwrap_or_else(|e| panic!("{e}"));
        }
        assert_eq!(out[..PREFACE_LEN], preface()[..]);
        let blocks = decode_headers(&mut Decoder::new(), &out[PREFACE_LEN..]);
        let got: Vec<String> = blocks.iter().map(|b| authority(b)).collect();
        assert_eq!(got, ["localhost", "localhost", "node-a:10250"]);
        assert_eq!(blocks[0][2].1, b"/pluginregistration.Registration/GetInfo");
        let data_at = out.windows(5).position(|w| w == b"\0\0\0\0\0");
        assert!(data_at.is_some(), "the DATA frame's payload passed through");
    }

    #[test]
    fn a_block_split_over_continuations_with_padding_and_priority_is_carried() {
        let mut client = Encoder::new();
        let big = vec![b'x'; 20_000];
        let fields: [(&[u8], &[u8]); 3] = [
            (b":authority", b"/run/x.sock"),
            (b":path", b"/a/B"),
            (b"grpc-trace-bin", &big),
        ];
        let block = client.encode(fields);
        let (a, b) = block.split_at(100);
        let mut input = preface();
        // HEADERS with 3 bytes of padding and a priority, then a CONTINUATION ending it.
        write_frame(
            &mut input,
            HEADERS,
            PADDED | PRIORITY | END_STREAM,
            7,
            &[&[3], &[0, 0, 0, 1, 15], a, &[0, 0, 0]],
        );
        write_frame(&mut input, CONTINUATION, END_HEADERS, 7, &[b]);
        let mut rw = Rewriter::new(lenient_authority());
        let mut out = Vec::new();
        rw.feed(&input, &mut out).unwrap_or_else(|e| panic!("{e}"));
        let blocks = decode_headers(&mut Decoder::new(), &out[PREFACE_LEN..]);
        assert_eq!(blocks.len(), 1);
        assert_eq!(authority(&blocks[0]), "localhost");
        assert_eq!(blocks[0][2].1, big);
        let first = &out[PREFACE_LEN..PREFACE_LEN + FRAME_HEADER_LEN];
        assert_eq!(
            first[4],
            END_STREAM | PRIORITY,
            "END_STREAM and PRIORITY kept, padding dropped, more to come"
        );
    }

    #[test]
    fn broken_input_is_refused_not_carried() {
        // What a fresh rewriter says of the preface followed by `frames`.
        let refusal = |frames: &[u8]| {
            let mut input = preface();
            input.extend_from_slice(frames);
            Rewriter::new(lenient_authority())
                .feed(&input, &mut Vec::new())
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default()
        };
        let mut stray = Vec::new();
        write_frame(&mut stray, CONTINUATION, END_HEADERS, 1, &[b"\x82"]);
        assert_eq!(
            refusal(&stray),
            "CONTINUATION on stream 1 with no header block open"
        );
        let mut bad_index = Vec::new();
        // Index 200 names no table entry.
        write_frame(&mut bad_index, HEADERS, END_HEADERS, 1, &[&[0xff, 0x49]]);
        let err = refusal(&bad_index);
        assert!(
            err.starts_with("HPACK block on stream 1 does not decode"),
            "{err}"
        );
        let err = refusal(&[0x20, 0, 0, HEADERS, 0, 0, 0, 0, 1]);
        assert!(
            err.starts_with("header frame of 2097152 bytes on stream 1"),
            "{err}"
        );
    }
}
