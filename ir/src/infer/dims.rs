//! Dim arithmetic used by the inference rules: broadcasting, normalized floor division, exact
//! division of products (for `Reshape` with `-1`).

use crate::dim::{Atom, Dim, DimExpr};
use crate::module::Module;

/// Broadcasts two dims (ONNX multidirectional broadcasting): equal dims merge, `1` yields the
/// other, a known dim other than 1 wins over an unknown or symbolic one (the other must then be 1
/// or equal), and anything else is [`Dim::Unknown`].
pub fn broadcast_dims(a: &Dim, b: &Dim) -> Dim {
    if a.provably_eq(b) {
        return a.clone();
    }
    match (a.as_known(), b.as_known()) {
        (Some(1), _) => b.clone(),
        (_, Some(1)) => a.clone(),
        (Some(_), Some(_)) => Dim::Unknown,
        (Some(_), None) => a.clone(),
        (None, Some(_)) => b.clone(),
        (None, None) => Dim::Unknown,
    }
}

/// Broadcasts shapes right-aligned; `None` when a rank is unknown or no shape is given.
pub fn broadcast_shapes(shapes: &[Option<&[Dim]>]) -> Option<Vec<Dim>> {
    let shapes: Vec<&[Dim]> = shapes.iter().copied().collect::<Option<_>>()?;
    let rank = shapes.iter().map(|s| s.len()).max()?;
    let mut out = vec![Dim::known(1); rank];
    for s in shapes {
        let off = rank - s.len();
        for (i, d) in s.iter().enumerate() {
            out[off + i] = broadcast_dims(&out[off + i], d);
        }
    }
    Some(out)
}

/// Combines two descriptions of the same dim: unknown yields the other, a constant wins over a
/// symbolic expression, otherwise the first is kept.
pub(crate) fn unify_dim(a: &Dim, b: &Dim) -> Dim {
    match (a, b) {
        (Dim::Unknown, _) => b.clone(),
        (_, Dim::Unknown) => a.clone(),
        _ if a.as_known().is_none() && b.as_known().is_some() => b.clone(),
        _ => a.clone(),
    }
}

/// Rebuilds an expression from a monomial of a canonical form; `None` on overflow.
fn monomial(atoms: &[Atom], coef: i64) -> Option<DimExpr> {
    let mut e = DimExpr::constant(coef);
    for a in atoms {
        let f = match a {
            Atom::Sym(s) => DimExpr::sym(*s),
            Atom::Div(inner, d) => match inner.floor_div(*d) {
                Some(x) => x,
                None => return Some(DimExpr::constant(0)),
            },
        };
        e = e.mul(&f)?;
    }
    Some(e)
}

/// `floor(e / d)` for `d > 0`, pulling out every term and the part of the constant that `d`
/// divides: `(h - 16) / 16` becomes `h / 16 - 1`.
pub fn floor_div(e: &Dim, d: i64) -> Dim {
    let Dim::Expr(e) = e else {
        return Dim::Unknown;
    };
    if d <= 0 {
        return Dim::Unknown;
    }
    let split = || {
        let (terms, constant) = e.parts();
        let mut whole = DimExpr::constant(constant.div_euclid(d));
        let mut rest = DimExpr::constant(constant.rem_euclid(d));
        for (atoms, c) in terms {
            if c % d == 0 {
                whole = whole.add(&monomial(atoms, c / d)?)?;
            } else {
                rest = rest.add(&monomial(atoms, *c)?)?;
            }
        }
        whole.add(&rest.floor_div(d)?)
    };
    split().map_or(Dim::Unknown, Dim::Expr)
}

/// `ceil(e / d)` for `d > 0`.
pub fn ceil_div(e: &Dim, d: i64) -> Dim {
    floor_div(&e.add(&Dim::known(d.saturating_sub(1))), d)
}

/// Divides every coefficient and the constant by `k` (the caller checked each is a multiple).
fn div_coefficients(e: &DimExpr, k: i64) -> Option<DimExpr> {
    let (terms, constant) = e.parts();
    let mut out = DimExpr::constant(constant / k);
    for (atoms, c) in terms {
        out = out.add(&monomial(atoms, c / k)?)?;
    }
    Some(out)
}

/// `a / b` when the division is provably exact (`b` a non-zero constant dividing every
/// coefficient, or a monomial dividing every term of `a`); `None` otherwise.
pub fn exact_div(a: &DimExpr, b: &DimExpr) -> Option<DimExpr> {
    if let Some(k) = b.as_constant() {
        if k == 0 {
            return None;
        }
        let (terms, constant) = a.parts();
        if constant % k != 0 || terms.iter().any(|(_, c)| c % k != 0) {
            return None;
        }
        return div_coefficients(a, k);
    }
    let (bt, bc) = b.parts();
    let [(batoms, bcoef)] = bt else {
        return None;
    };
    if bc != 0 {
        return None;
    }
    let (terms, constant) = a.parts();
    if constant != 0 {
        return None;
    }
    let mut out = DimExpr::constant(0);
    for (atoms, c) in terms {
        if c % bcoef != 0 {
            return None;
        }
        let mut rest = atoms.clone();
        for x in batoms {
            let pos = rest.iter().position(|y| y == x)?;
            rest.remove(pos);
        }
        out = out.add(&monomial(&rest, c / bcoef)?)?;
    }
    Some(out)
}

/// `Π num / Π den`, cancelling structurally equal factors first; [`Dim::Unknown`] unless the
/// quotient is provably exact.
pub(crate) fn product_div(num: &[Dim], den: &[Dim]) -> Dim {
    let mut num_syms: Vec<&DimExpr> = Vec::new();
    let mut den_syms: Vec<&DimExpr> = Vec::new();
    let (mut cn, mut cd) = (1i64, 1i64);
    for d in num {
        let Dim::Expr(e) = d else {
            return Dim::Unknown;
        };
        match e.as_constant() {
            Some(k) => match cn.checked_mul(k) {
                Some(x) => cn = x,
                None => return Dim::Unknown,
            },
            None => num_syms.push(e),
        }
    }
    for d in den {
        let Dim::Expr(e) = d else {
            return Dim::Unknown;
        };
        match e.as_constant() {
            Some(k) => match cd.checked_mul(k) {
                Some(x) => cd = x,
                None => return Dim::Unknown,
            },
            None => match num_syms.iter().position(|x| *x == e) {
                Some(p) => {
                    num_syms.remove(p);
                }
                None => den_syms.push(e),
            },
        }
    }
    if cd == 0 {
        return Dim::Unknown;
    }
    let g = gcd(cn, cd);
    let (cn, cd) = if g == 0 { (cn, cd) } else { (cn / g, cd / g) };
    let quotient = || {
        let n = num_syms
            .iter()
            .try_fold(DimExpr::constant(cn), |acc, e| acc.mul(e))?;
        let d = den_syms
            .iter()
            .try_fold(DimExpr::constant(cd), |acc, e| acc.mul(e))?;
        exact_div(&n, &d)
    };
    quotient().map_or(Dim::Unknown, Dim::Expr)
}

fn gcd(a: i64, b: i64) -> i64 {
    let (mut a, mut b) = (a.unsigned_abs(), b.unsigned_abs());
    while b != 0 {
        (a, b) = (b, a % b);
    }
    i64::try_from(a).unwrap_or(1)
}

/// The product of dims (unknown if any is).
pub(crate) fn product(dims: &[Dim]) -> Dim {
    dims.iter().fold(Dim::known(1), |acc, d| acc.mul(d))
}

/// A lower bound of `d` from the declared minimums of its symbols (1 where undeclared, as for
/// [`crate::SymbolData::min`]); `None`
/// when unknown or when a negative coefficient defeats this simple bound.
pub(crate) fn lower_bound(m: &Module, d: &Dim) -> Option<i64> {
    fn expr(m: &Module, e: &DimExpr) -> Option<i64> {
        let (terms, constant) = e.parts();
        let mut total = constant;
        for (atoms, coef) in terms {
            if *coef < 0 {
                return None;
            }
            let mut prod = *coef;
            for a in atoms {
                let v = match a {
                    Atom::Sym(s) => m.symbols.get(*s)?.min.unwrap_or(1).max(0),
                    Atom::Div(inner, k) => expr(m, inner)?.max(0).div_euclid(*k),
                };
                prod = prod.checked_mul(v)?;
            }
            total = total.checked_add(prod)?;
        }
        Some(total)
    }
    expr(m, d.expr()?)
}
