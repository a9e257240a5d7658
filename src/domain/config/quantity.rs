//! Memory quantities as the config file and the size flags write them (`10Gi`, `512Mi`,
//! `2G`, bytes).

use super::file::Quantity;

/// Parse a memory quantity: bytes, or a number with a Ki/Mi/Gi/Ti (binary) or k/M/G/T
/// (decimal) suffix.
/// Why a quantity is refused; the caller names the field and the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum QuantityError {
    /// No integer before the suffix.
    #[error("expected an integer with an optional Ki/Mi/Gi/Ti suffix")]
    NotANumber,
    /// A suffix other than the binary and decimal ones.
    #[error("unknown suffix `{0}` (use Ki, Mi, Gi, Ti, k, M, G, T)")]
    Suffix(String),
    /// More bytes than a u64 holds.
    #[error("quantity overflows")]
    Overflow,
    /// Zero bytes.
    #[error("must be greater than 0")]
    Zero,
}

pub(crate) fn parse_quantity(q: &Quantity) -> Result<u64, QuantityError> {
    let text = match q {
        Quantity::Bytes(b) => return nonzero(*b),
        Quantity::Text(t) => t.trim(),
    };
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (num, suffix) = text.split_at(split);
    let num: u64 = num.parse().map_err(|_| QuantityError::NotANumber)?;
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
        other => return Err(QuantityError::Suffix(other.to_string())),
    };
    nonzero(num.checked_mul(mult).ok_or(QuantityError::Overflow)?)
}

/// [`parse_quantity`] of a quantity written as text (a flag, an environment variable).
pub(crate) fn parse_quantity_text(text: &str) -> Result<u64, QuantityError> {
    parse_quantity(&Quantity::Text(text.into()))
}

/// A byte count as a person reads it and a config can take it back: the largest of Ti, Gi
/// and Mi that divides it exactly (`30Gi`, `81559Mi`), else GiB with two decimals from 1 GiB
/// up (`27.94Gi`), else Ki or bytes.
pub(crate) fn format_quantity(bytes: u64) -> String {
    let exact = |size: u64| bytes >= size && bytes.is_multiple_of(size);
    for (unit, size) in [("Ti", 1u64 << 40), ("Gi", 1 << 30), ("Mi", 1 << 20)] {
        if exact(size) {
            return format!("{}{unit}", bytes / size);
        }
    }
    if bytes >= 1 << 30 {
        return format!("{:.2}Gi", bytes as f64 / (1u64 << 30) as f64);
    }
    if exact(1 << 10) {
        return format!("{}Ki", bytes >> 10);
    }
    bytes.to_string()
}

fn nonzero(b: u64) -> Result<u64, QuantityError> {
    if b == 0 {
        Err(QuantityError::Zero)
    } else {
        Ok(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_counts_read_in_the_units_a_config_writes() {
        assert_eq!(format_quantity(30 << 30), "30Gi");
        assert_eq!(format_quantity(120 << 30), "120Gi");
        assert_eq!(format_quantity(2 << 40), "2Ti");
        assert_eq!(format_quantity(512 << 20), "512Mi");
        assert_eq!(format_quantity(81559 << 20), "81559Mi");
        assert_eq!(format_quantity(3 << 10), "3Ki");
        assert_eq!(format_quantity(30_000_000_000), "27.94Gi");
        assert_eq!(format_quantity(1000), "1000");
        for b in [30u64 << 30, 512 << 20, 3 << 10] {
            assert_eq!(parse_quantity_text(&format_quantity(b)), Ok(b));
        }
    }
}
