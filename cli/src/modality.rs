//! `--modality INPUT=KIND` and the modality labels `inspect` prints.

use mmq_ir::modality::Modality;

/// Parses one `--modality` value, `NAME=KIND`.
pub fn parse_modality_arg(s: &str) -> Result<(String, Modality), String> {
    let Some((name, kind)) = s.rsplit_once('=') else {
        return Err(format!(
            "'{s}' is not INPUT=KIND (for example pixel_values=vision)"
        ));
    };
    if name.is_empty() {
        return Err(format!("'{s}': the input name is empty"));
    }
    let kind: Modality = kind.parse().map_err(|e| format!("{e}"))?;
    Ok((name.to_owned(), kind))
}
