//! Memory quantities as the config file and the size flags write them (`10Gi`, `512Mi`,
//! `2G`, bytes).

use super::file::Quantity;

/// Parse a memory quantity: bytes, or a number with a Ki/Mi/Gi/Ti (binary) or k/M/G/T
/// (decimal) suffix.
pub(crate) fn parse_quantity(q: &Quantity) -> std::result::Result<u64, String> {
    let text = match q {
        Quantity::Bytes(b) => return nonzero(*b),
        Quantity::Text(t) => t.trim(),
    };
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (num, suffix) = text.split_at(split);
    let num: u64 = num
        .parse()
        .map_err(|_| "expected an integer with an optional Ki/Mi/Gi/Ti suffix".to_string())?;
    let mult: u64 = match suffix {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        other => {
            return Err(format!(
                "unknown suffix `{other}` (use Ki, Mi, Gi, Ti, k, M, G, T)"
            ));
        }
    };
    nonzero(
        num.checked_mul(mult)
            .ok_or_else(|| "quantity overflows".to_string())?,
    )
}

/// [`parse_quantity`] of a quantity written as text (a flag, an environment variable).
pub(crate) fn parse_quantity_text(text: &str) -> std::result::Result<u64, String> {
    parse_quantity(&Quantity::Text(text.into()))
}

fn nonzero(b: u64) -> std::result::Result<u64, String> {
    if b == 0 {
        Err("must be greater than 0".into())
    } else {
        Ok(b)
    }
}
