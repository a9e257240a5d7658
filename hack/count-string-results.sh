#!/usr/bin/env bash
# Counts `Result<_, String>` lines in production code under src/: files named *tests.rs are
# skipped, and so is every item behind #[cfg(test)] (brace-counted to its end).
set -euo pipefail
cd "$(dirname "$0")/.."
find src -name '*.rs' ! -name '*tests.rs' ! -path '*/tests/*' -print0 | sort -z |
  xargs -0 awk '
    FNR == 1 { skip = 0; depth = 0; armed = 0 }
    /^[[:space:]]*#\[cfg\(test\)\]/ { armed = 1; next }
    armed && !skip { if ($0 ~ /;[[:space:]]*$/ && $0 !~ /\{/) { armed = 0; next } skip = 1; depth = 0; armed = 0 }
    skip {
      n = split($0, c, ""); for (i = 1; i <= n; i++) { if (c[i] == "{") { depth++; opened = 1 } else if (c[i] == "}") depth-- }
      if (opened && depth <= 0) { skip = 0; opened = 0 }
      next
    }
    /Result<[^;{]*,[[:space:]]*String>([^,]|$)/ { print FILENAME ":" FNR ": " $0 }
  '
