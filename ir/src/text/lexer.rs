//! The `.mmir` lexer: bytes to tokens, each with its byte span.

use std::ops::Range;

use super::ParseError;

/// How a sigil name (`%x`, `$w`, `@main`) was written.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum RefName {
    /// A source name (bare identifier or quoted), with its `#k` duplicate index (0 when absent).
    Named(String, u32),
    /// A print-time number (`%12`): the entity has no source name.
    Num(u64),
}

/// A token kind.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Tok {
    /// An identifier or keyword: `[A-Za-z_][A-Za-z0-9_.]*`.
    Ident(String),
    /// An integer literal (decimal or `0x` hex), without sign.
    Int(u128),
    /// A floating-point literal, as written (contains `.` or an exponent).
    Float(String),
    /// A string literal, decoded to bytes.
    Str(Vec<u8>),
    /// `%name`.
    Value(RefName),
    /// `$name`.
    Const(RefName),
    /// `@name`.
    Graph(RefName),
    /// `->`.
    Arrow,
    /// One of `( ) [ ] { } < > , : = + - * / ? .`.
    Punct(char),
    /// End of input.
    Eof,
}

/// A token and where it is.
#[derive(Clone, Debug)]
pub(crate) struct Token {
    pub tok: Tok,
    pub span: Range<usize>,
    /// Whether a line break precedes the token (statements end at line breaks).
    pub line_start: bool,
}

fn is_ident_start(c: u8) -> bool {
    c.is_ascii_alphabetic() || c == b'_'
}

fn is_ident_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c == b'.'
}

/// Whether `s` can be written without quotes after a sigil or as a bare name.
pub(crate) fn is_ident(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty() && is_ident_start(b[0]) && b.iter().all(|&c| is_ident_char(c))
}

/// Splits `src` into tokens. Lexical errors are reported and lexing continues.
pub(crate) fn lex(src: &str) -> (Vec<Token>, Vec<ParseError>) {
    let mut lx = Lexer {
        src: src.as_bytes(),
        pos: 0,
        tokens: Vec::new(),
        errors: Vec::new(),
        line_start: true,
    };
    lx.run();
    (lx.tokens, lx.errors)
}

struct Lexer<'a> {
    src: &'a [u8],
    pos: usize,
    tokens: Vec<Token>,
    errors: Vec<ParseError>,
    line_start: bool,
}

impl Lexer<'_> {
    fn peek(&self, k: usize) -> Option<u8> {
        self.src.get(self.pos + k).copied()
    }

    fn push(&mut self, tok: Tok, start: usize) {
        self.tokens.push(Token {
            tok,
            span: start..self.pos,
            line_start: self.line_start,
        });
        self.line_start = false;
    }

    fn error(&mut self, span: Range<usize>, message: impl Into<String>) {
        self.errors.push(ParseError::new(span, message));
    }

    fn text(&self, range: Range<usize>) -> String {
        String::from_utf8_lossy(self.src.get(range).unwrap_or_default()).into_owned()
    }

    fn run(&mut self) {
        while let Some(c) = self.peek(0) {
            let start = self.pos;
            match c {
                b'\n' => {
                    self.pos += 1;
                    self.line_start = true;
                }
                b' ' | b'\t' | b'\r' => self.pos += 1,
                b'/' if self.peek(1) == Some(b'/') => {
                    while self.peek(0).is_some_and(|c| c != b'\n') {
                        self.pos += 1;
                    }
                }
                b'"' => {
                    if let Some(s) = self.string() {
                        self.push(Tok::Str(s), start);
                    }
                }
                b'%' | b'$' | b'@' => {
                    self.pos += 1;
                    match self.sigil_name(start) {
                        Some(name) => {
                            let tok = match c {
                                b'%' => Tok::Value(name),
                                b'$' => Tok::Const(name),
                                _ => Tok::Graph(name),
                            };
                            self.push(tok, start);
                        }
                        None => self.skip_word(),
                    }
                }
                b'-' if self.peek(1) == Some(b'>') => {
                    self.pos += 2;
                    self.push(Tok::Arrow, start);
                }
                c if c.is_ascii_digit() => self.number(),
                c if is_ident_start(c) => {
                    self.skip_word();
                    let s = self.text(start..self.pos);
                    self.push(Tok::Ident(s), start);
                }
                b'(' | b')' | b'[' | b']' | b'{' | b'}' | b'<' | b'>' | b',' | b':' | b'='
                | b'+' | b'-' | b'*' | b'/' | b'?' | b'.' => {
                    self.pos += 1;
                    self.push(Tok::Punct(c as char), start);
                }
                _ => {
                    // Skip one whole UTF-8 character.
                    self.pos = (self.pos + utf8_len(c)).min(self.src.len());
                    let shown = self.text(start..self.pos);
                    self.error(start..self.pos, format!("unexpected character `{shown}`"));
                }
            }
        }
        let end = self.src.len();
        self.tokens.push(Token {
            tok: Tok::Eof,
            span: end..end,
            line_start: true,
        });
    }

    fn skip_word(&mut self) {
        while self.peek(0).is_some_and(is_ident_char) {
            self.pos += 1;
        }
    }

    fn digits(&mut self, radix: u32) -> String {
        let s = self.pos;
        while self.peek(0).is_some_and(|c| (c as char).is_digit(radix)) {
            self.pos += 1;
        }
        self.text(s..self.pos)
    }

    /// The name after a sigil: digits, an identifier or a string, then an optional `#k`.
    fn sigil_name(&mut self, start: usize) -> Option<RefName> {
        let name = match self.peek(0) {
            Some(c) if c.is_ascii_digit() => {
                let digits = self.digits(10);
                if self.peek(0).is_some_and(is_ident_char) {
                    self.skip_word();
                    self.error(
                        start..self.pos,
                        "a name that starts with a digit must be quoted, as in `%\"1a\"`",
                    );
                    return None;
                }
                return match digits.parse::<u64>() {
                    Ok(n) => Some(RefName::Num(n)),
                    Err(_) => {
                        self.error(start..self.pos, "number is too large");
                        None
                    }
                };
            }
            Some(c) if is_ident_start(c) => {
                let s = self.pos;
                self.skip_word();
                self.text(s..self.pos)
            }
            Some(b'"') => {
                let bytes = self.string()?;
                match String::from_utf8(bytes) {
                    Ok(s) => s,
                    Err(_) => {
                        self.error(start..self.pos, "a name must be valid UTF-8");
                        return None;
                    }
                }
            }
            _ => {
                self.error(
                    start..self.pos,
                    "expected a name after the sigil (an identifier, a number or a quoted string)",
                );
                return None;
            }
        };
        let mut dup = 0;
        if self.peek(0) == Some(b'#') {
            let s = self.pos;
            self.pos += 1;
            match self.digits(10).parse::<u32>() {
                Ok(n) => dup = n,
                Err(_) => {
                    self.error(s..self.pos, "expected a number after `#`");
                    return None;
                }
            }
        }
        Some(RefName::Named(name, dup))
    }

    fn number(&mut self) {
        let start = self.pos;
        if self.peek(0) == Some(b'0') && matches!(self.peek(1), Some(b'x' | b'X')) {
            self.pos += 2;
            let digits = self.digits(16);
            if self.peek(0).is_some_and(is_ident_char) || digits.is_empty() {
                self.skip_word();
                self.error(start..self.pos, "malformed hexadecimal number");
                return;
            }
            match u128::from_str_radix(&digits, 16) {
                Ok(n) => self.push(Tok::Int(n), start),
                Err(_) => self.error(start..self.pos, "number is too large"),
            }
            return;
        }
        let mut float = false;
        self.digits(10);
        if self.peek(0) == Some(b'.') && self.peek(1).is_some_and(|c| c.is_ascii_digit()) {
            float = true;
            self.pos += 1;
            self.digits(10);
        }
        if matches!(self.peek(0), Some(b'e' | b'E')) {
            let save = self.pos;
            self.pos += 1;
            if matches!(self.peek(0), Some(b'+' | b'-')) {
                self.pos += 1;
            }
            if self.peek(0).is_some_and(|c| c.is_ascii_digit()) {
                float = true;
                self.digits(10);
            } else {
                self.pos = save;
            }
        }
        if self.peek(0).is_some_and(|c| is_ident_char(c) && c != b'.') {
            self.skip_word();
            self.error(start..self.pos, "malformed number");
            return;
        }
        let text = self.text(start..self.pos);
        if float {
            self.push(Tok::Float(text), start);
        } else {
            match text.parse::<u128>() {
                Ok(n) => self.push(Tok::Int(n), start),
                Err(_) => self.error(start..self.pos, "number is too large"),
            }
        }
    }

    /// A string literal starting at `"`; `None` (with an error) when it is not terminated.
    fn string(&mut self) -> Option<Vec<u8>> {
        let start = self.pos;
        self.pos += 1;
        let mut out = Vec::new();
        loop {
            let Some(c) = self.peek(0) else {
                self.error(start..self.pos, "unterminated string");
                return None;
            };
            match c {
                b'"' => {
                    self.pos += 1;
                    return Some(out);
                }
                b'\n' => {
                    self.error(
                        start..self.pos,
                        "unterminated string (write a line break as `\\n`)",
                    );
                    return None;
                }
                b'\\' => self.escape(&mut out),
                _ => {
                    out.push(c);
                    self.pos += 1;
                }
            }
        }
    }

    /// One escape sequence at `\`, appended to `out`.
    fn escape(&mut self, out: &mut Vec<u8>) {
        let esc = self.pos;
        self.pos += 1;
        let simple = match self.peek(0) {
            Some(b'n') => Some(b'\n'),
            Some(b't') => Some(b'\t'),
            Some(b'r') => Some(b'\r'),
            Some(b'0') => Some(0),
            Some(b'\\') => Some(b'\\'),
            Some(b'"') => Some(b'"'),
            _ => None,
        };
        if let Some(b) = simple {
            out.push(b);
            self.pos += 1;
            return;
        }
        match self.peek(0) {
            Some(b'x') => {
                self.pos += 1;
                let hex = self.src.get(self.pos..self.pos + 2);
                match hex
                    .and_then(|h| std::str::from_utf8(h).ok())
                    .filter(|h| h.bytes().all(|c| c.is_ascii_hexdigit()))
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                {
                    Some(b) => {
                        out.push(b);
                        self.pos += 2;
                    }
                    None => self.error(esc..self.pos, "`\\x` must be followed by two hex digits"),
                }
            }
            Some(b'u') if self.peek(1) == Some(b'{') => {
                self.pos += 2;
                let digits = self.digits(16);
                let ch = u32::from_str_radix(&digits, 16)
                    .ok()
                    .and_then(char::from_u32);
                match ch {
                    Some(ch) if self.peek(0) == Some(b'}') => {
                        self.pos += 1;
                        let mut buf = [0u8; 4];
                        out.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
                    }
                    _ => self.error(esc..self.pos, "malformed `\\u{...}` escape"),
                }
            }
            Some(c) => {
                self.pos = (self.pos + utf8_len(c)).min(self.src.len());
                self.error(esc..self.pos, "unknown escape sequence");
            }
            None => {}
        }
    }
}

fn utf8_len(first: u8) -> usize {
    match first {
        0xf0..=0xff => 4,
        0xe0..=0xef => 3,
        0xc0..=0xdf => 2,
        _ => 1,
    }
}

/// Writes `bytes` as a quoted string literal: valid UTF-8 as is, `"` and `\` escaped, control
/// characters as `\n`, `\t`, `\r`, `\0` or `\u{..}`, bytes that are not UTF-8 as `\xNN`.
pub(crate) fn quote(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() + 2);
    out.push('"');
    for chunk in bytes.utf8_chunks() {
        for ch in chunk.valid().chars() {
            match ch {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\t' => out.push_str("\\t"),
                '\r' => out.push_str("\\r"),
                '\0' => out.push_str("\\0"),
                c if c.is_control() => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
                c => out.push(c),
            }
        }
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out.push('"');
    out
}

/// A name as written after a sigil or as a bare name: itself when it is an identifier, else quoted.
pub(crate) fn name_text(name: &str) -> String {
    if is_ident(name) {
        name.to_owned()
    } else {
        quote(name.as_bytes())
    }
}
