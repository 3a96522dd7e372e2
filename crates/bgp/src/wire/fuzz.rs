//! Robustness: decoding random and damaged bytes must return, never
//! panic; an error must be a NOTIFICATION a speaker can send; and what it
//! accepts must encode again and decode to the same message, so nothing a
//! peer sends leaves the session holding a value it cannot send back.
//! The test kit's seeded generator keeps it deterministic.

use super::tests::samples;
use super::*;

use podnet_testkit::Rng;

const CODECS: [Codec; 2] = [
    Codec {
        four_octet_as: false,
    },
    Codec {
        four_octet_as: true,
    },
];

/// Decodes `buf` and checks what came back.
fn check(codec: &Codec, buf: &[u8]) {
    match codec.decode(buf) {
        Ok(None) => {}
        Ok(Some((m, n))) => {
            assert!((19..=buf.len()).contains(&n), "{n} of {}", buf.len());
            let mut out = Vec::new();
            match codec.encode(&m, &mut out) {
                // Re-encoding can add an empty AS_PATH to a full message.
                Err(EncodeError::TooLong) => assert!(n > MAX_LEN - 8),
                Err(e) => panic!("{m:?} decoded from {buf:02x?} does not encode: {e}"),
                Ok(()) => {
                    let back = codec.decode(&out).unwrap().unwrap().0;
                    assert_eq!(back, m, "from {buf:02x?}");
                }
            }
        }
        Err(e) => {
            assert!((1..=7).contains(&e.code), "{e:?}");
            assert!(e.data.len() <= MAX_LEN, "{e:?}");
            let _ = e.notification().describe();
        }
    }
}

/// A header of `kind` announcing `body` exactly, then `body`.
fn framed(kind: u8, body: &[u8]) -> Vec<u8> {
    let mut m = vec![0xff; 16];
    m.extend_from_slice(&((19 + body.len()) as u16).to_be_bytes());
    m.push(kind);
    m.extend_from_slice(body);
    m
}

/// A path attribute list of attributes this codec knows (or not), with
/// right or random flags and lengths, so decoding gets past the framing.
fn attr_list(rng: &mut Rng) -> Vec<u8> {
    const CODES: [(u8, u8); 16] = [
        (1, 0x40),
        (2, 0x40),
        (3, 0x40),
        (4, 0x80),
        (5, 0x40),
        (6, 0x40),
        (7, 0xc0),
        (8, 0xc0),
        (9, 0x80),
        (10, 0x80),
        (14, 0x80),
        (15, 0x80),
        (17, 0xc0),
        (18, 0xc0),
        (32, 0xc0),
        (99, 0xc0),
    ];
    let mut v = Vec::new();
    for _ in 0..rng.below(6) {
        let (code, flags) = CODES[rng.below(CODES.len())];
        let flags = if rng.below(8) == 0 { rng.byte() } else { flags };
        let len = [0, 1, 4, 6, 8, 12, 16, 21, 33][rng.below(9)];
        let mut value = rng.bytes(len);
        if code == 14 || code == 15 {
            // A plausible family and next hop length, most of the time.
            value = [
                &[0, 1 + rng.below(2) as u8, 1, [4, 16, 32][rng.below(3)]],
                &value[..],
            ]
            .concat();
        }
        v.extend_from_slice(&[flags & !0x10, code, value.len() as u8]);
        v.extend_from_slice(&value);
    }
    v
}

fn random_update_body(rng: &mut Rng) -> Vec<u8> {
    let withdrawn = {
        let n = rng.below(3) * 5;
        rng.bytes(n)
    };
    let attrs = attr_list(rng);
    let mut b = (withdrawn.len() as u16).to_be_bytes().to_vec();
    b.extend_from_slice(&withdrawn);
    b.extend_from_slice(&(attrs.len() as u16).to_be_bytes());
    b.extend_from_slice(&attrs);
    b.extend_from_slice(&rng.bytes_below(10));
    b
}

#[test]
fn random_bytes_never_panic() {
    let mut rng = Rng::new(0x9e37_79b9_7f4a_7c15);
    for i in 0..60_000 {
        let codec = &CODECS[i % 2];
        let buf = match i % 4 {
            0 => rng.bytes_below(64),
            1 => {
                // A sound marker, then anything.
                let mut b = vec![0xff; 16];
                b.extend(rng.bytes_below(300));
                b
            }
            2 => framed(1 + rng.below(5) as u8, &rng.bytes_below(120)),
            _ => framed(2, &random_update_body(&mut rng)),
        };
        check(codec, &buf);
    }
}

/// One random change to a message, keeping its header's length in step
/// with its size half of the time.
fn mutate(rng: &mut Rng, m: &mut Vec<u8>) {
    let at = rng.below(m.len());
    match rng.below(5) {
        0 => m[at] = rng.byte(),
        1 => m[at] ^= 1 << rng.below(8),
        2 => m.truncate(at),
        3 => m.insert(at, rng.byte()),
        _ => {
            m.remove(at);
        }
    }
    if rng.below(2) == 0 && m.len() >= 18 {
        let len = (m.len() as u16).to_be_bytes();
        m[16..18].copy_from_slice(&len);
    }
}

#[test]
fn damaged_messages_never_panic() {
    let mut rng = Rng::new(0x2545_f491_4f6c_dd1d);
    for codec in &CODECS {
        for sample in samples() {
            let mut clean = Vec::new();
            if codec.encode(&sample, &mut clean).is_err() {
                continue;
            }
            for _ in 0..3_000 {
                let mut m = clean.clone();
                for _ in 0..1 + rng.below(3) {
                    if !m.is_empty() {
                        mutate(&mut rng, &mut m);
                    }
                }
                check(codec, &m);
            }
        }
    }
}
