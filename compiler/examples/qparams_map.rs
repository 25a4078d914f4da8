//! Holds a QPQR table the way a serving process does, for `tools/qpqr_share.py`: maps it (or,
//! with `--copy`, reads it into private memory), reads every byte (`verify`), prints `ready`,
//! and keeps it until standard input closes.

use std::io::{Read, Write};
use std::path::PathBuf;

use mmq_compiler::qparams::QParamTable;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = PathBuf::from(args.next().ok_or("usage: qparams_map TABLE [--copy]")?);
    let copy = args.next().as_deref() == Some("--copy");
    let table = QParamTable::open(&path)?;
    table.verify()?;
    let private: Option<Vec<u8>> = copy.then(|| table.bytes().to_vec());
    let held = private.as_ref().map_or(table.bytes().len(), Vec::len);
    writeln!(std::io::stdout(), "ready {} {held}", std::process::id())?;
    std::io::stdout().flush()?;
    let mut sink = Vec::new();
    std::io::stdin().read_to_end(&mut sink)?;
    // Keep both alive until here.
    drop(private);
    drop(table);
    Ok(())
}
