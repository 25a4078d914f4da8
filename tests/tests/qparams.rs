//! QPQR tables: what `write_table` writes is every scale and zero point of the compiled model,
//! bit for bit; the reader refuses every truncation and every single-byte corruption (layout
//! errors at `open`, the rest at `verify`), never reading out of bounds.

use std::path::Path;

use mmq_compiler::qparams::{Layout, QParamTable, collect, write_table};
use mmq_compiler::{CompileOptions, Precision, Scheme, compile};
use mmq_ir::{DType, Module};
use mmq_passes::quant::place::Placement;
use mmq_tests::{repo_root, scratch_dir};

fn compiled(scheme: Scheme) -> Module {
    let path = repo_root().join("tests/fixtures/llama_gqa_kv/model.onnx");
    let (mut m, _) = mmq_compiler::load::load(&[path])
        .and_then(|l| l.verified())
        .unwrap_or_else(|e| panic!("{}", e.rendered));
    let options = CompileOptions {
        precision: Precision::of(scheme),
        placement: Placement::All,
        calibration: mmq_compiler::CalibrationSource::Random { count: 2, seed: 0 },
        accuracy: mmq_compiler::Accuracy::Off,
        ..CompileOptions::default()
    };
    compile(&mut m, &options).unwrap_or_else(|e| panic!("{scheme}: {e}"));
    m
}

#[test]
fn the_table_holds_every_scale_and_zero_point_bit_for_bit() {
    let dir = scratch_dir("qparams-exact");
    for scheme in [Scheme::Int8, Scheme::Int4, Scheme::Fp8] {
        let mut m = compiled(scheme);
        let path = dir.join(format!("{scheme}.qpqr"));
        let (written, refs) = write_table(&mut m, &path, Some(&dir)).expect("write");
        assert!(!written.entries.is_empty(), "{scheme}: no scales");
        assert_eq!(refs.len(), written.entries.len());
        let t = QParamTable::open(&path).expect("open");
        t.verify().expect("verify");
        assert_eq!(t.entries(), written.entries.as_slice());
        let found = collect(&m);
        assert_eq!(found.len(), t.entries().len());
        for (f, e) in found.iter().zip(t.entries()) {
            let c = &m.consts[f.scale];
            assert_eq!(m.values[f.value].name.as_deref(), Some(e.name.as_str()));
            assert_eq!(t.raw(e), c.raw_bytes().unwrap(), "{}", e.name);
            assert_eq!(e.count as usize, c.num_elements());
            let pairs = t.pairs(e);
            // Zero points: the model's, or MatMulNBits' default 8.
            let zeros: Vec<i16> = match f.zero {
                Some(z) => {
                    let zc = &m.consts[z];
                    let b = zc.raw_bytes().unwrap();
                    match zc.dtype {
                        DType::U8 if !f.packed_zero => b.iter().map(|&x| i16::from(x)).collect(),
                        DType::I8 => b.iter().map(|&x| i16::from(x as i8)).collect(),
                        _ => pairs.iter().map(|p| p.1).collect(),
                    }
                }
                None => vec![f.default_zero as i16; pairs.len()],
            };
            assert_eq!(
                pairs.iter().map(|p| p.1).collect::<Vec<_>>(),
                zeros,
                "{}",
                e.name
            );
            match scheme {
                Scheme::Int4 => {
                    assert_eq!((e.scheme, e.group_size), (Layout::PerGroup, 32));
                }
                _ => assert!(matches!(e.scheme, Layout::PerTensor | Layout::PerChannel)),
            }
        }
    }
}

fn check_refused(path: &Path, bytes: &[u8], what: &str) {
    std::fs::write(path, bytes).unwrap();
    let verdict = QParamTable::open(path).and_then(|t| {
        // Reading every entry through the validated offsets must stay in bounds.
        for e in t.entries() {
            let _ = (t.pairs(e), t.raw(e));
        }
        t.verify()
    });
    assert!(verdict.is_err(), "{what}: accepted");
}

#[test]
fn truncated_and_corrupted_tables_are_refused() {
    let dir = scratch_dir("qparams-hostile");
    let mut m = compiled(Scheme::Int4);
    let good = dir.join("good.qpqr");
    write_table(&mut m, &good, None).expect("write");
    let bytes = std::fs::read(&good).unwrap();
    let bad = dir.join("bad.qpqr");
    for len in [0, 3, 63, 64, bytes.len() / 2, bytes.len() - 1] {
        check_refused(&bad, &bytes[..len], &format!("truncated to {len}"));
    }
    for at in 0..bytes.len() {
        let mut b = bytes.clone();
        b[at] ^= 0x5a;
        check_refused(&bad, &b, &format!("byte {at} flipped"));
    }
    // The messages say what and where.
    let mut b = bytes.clone();
    b[0] ^= 1;
    std::fs::write(&bad, &b).unwrap();
    let e = QParamTable::open(&bad).err().unwrap().to_string();
    assert!(e.contains("offset 0: magic"), "{e}");
    let mut b = bytes.clone();
    b[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
    std::fs::write(&bad, &b).unwrap();
    let e = QParamTable::open(&bad).err().unwrap().to_string();
    assert!(
        e.contains("offset 4:") && e.contains("run past the index"),
        "{e}"
    );
    let e = QParamTable::open(&dir).err().unwrap().to_string();
    assert!(e.contains("directory"), "{e}");
}

/// `bytes` with its checksum recomputed (xxh3-64 of the file with the checksum field zeroed,
/// stored at offset 56), as a tool that edits a table in place would leave it.
fn resealed(mut bytes: Vec<u8>) -> Vec<u8> {
    bytes[56..64].fill(0);
    let sum = xxhash_rust::xxh3::xxh3_64(&bytes);
    bytes[56..64].copy_from_slice(&sum.to_le_bytes());
    bytes
}

/// Tables whose layout and checksum are right but whose contents mean nothing: `verify`
/// refuses each, saying what.
#[test]
fn tables_that_mean_nothing_are_refused_with_a_matching_checksum() {
    let dir = scratch_dir("qparams-meaning");
    let mut m = compiled(Scheme::Int4);
    let good = dir.join("good.qpqr");
    write_table(&mut m, &good, None).expect("write");
    let bytes = std::fs::read(&good).unwrap();
    QParamTable::open(&good)
        .and_then(|t| t.verify())
        .expect("the good table verifies");
    let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap()) as usize;
    let (pairs, index) = (u64_at(16), u64_at(24));
    let entry = move |i: usize| index + 48 * i;
    let raw0 = u64_at(entry(0) + 32);
    type Edit = Box<dyn Fn(&mut Vec<u8>)>;
    let cases: Vec<(&str, Edit, &str)> = vec![
        (
            "a NaN scale in the pairs and the exact scales",
            Box::new(move |b: &mut Vec<u8>| {
                b[pairs..pairs + 2].copy_from_slice(&0x7e00u16.to_le_bytes());
                b[raw0..raw0 + 4].copy_from_slice(&f32::NAN.to_le_bytes());
            }),
            "has scale NaN",
        ),
        (
            "an infinite scale",
            Box::new(move |b: &mut Vec<u8>| {
                b[pairs..pairs + 2].copy_from_slice(&0x7c00u16.to_le_bytes());
                b[raw0..raw0 + 4].copy_from_slice(&f32::INFINITY.to_le_bytes());
            }),
            "has scale inf",
        ),
        (
            "a zero point outside the 4-bit codes",
            Box::new(move |b: &mut Vec<u8>| {
                b[pairs + 2..pairs + 4].copy_from_slice(&99u16.to_le_bytes());
            }),
            "zero point 99, outside its codes' range 0..=15",
        ),
        (
            "a group size of 0",
            Box::new(move |b: &mut Vec<u8>| b[entry(0) + 16..entry(0) + 20].fill(0)),
            "per-group with group size 0",
        ),
        (
            "two entries with one name",
            Box::new(move |b: &mut Vec<u8>| {
                let (e0, e1) = (entry(0), entry(1));
                let name = b[e0..e0 + 8].to_vec();
                b[e1..e1 + 8].copy_from_slice(&name);
            }),
            "are both named",
        ),
        (
            "two entries sharing pairs",
            Box::new(move |b: &mut Vec<u8>| {
                let (e0, e1) = (entry(0), entry(1));
                let first = b[e0 + 20..e0 + 24].to_vec();
                b[e1 + 20..e1 + 24].copy_from_slice(&first);
            }),
            "share pairs",
        ),
    ];
    let bad = dir.join("bad.qpqr");
    for (what, edit, want) in cases {
        let mut b = bytes.clone();
        edit(&mut b);
        std::fs::write(&bad, resealed(b)).unwrap();
        let verdict = QParamTable::open(&bad).and_then(|t| t.verify());
        let e = verdict
            .err()
            .unwrap_or_else(|| panic!("{what}: accepted"))
            .to_string();
        assert!(e.contains(want), "{what}: {e}");
    }
}
