"""PySpark data sources for ledgers and topics (planned; see the issues)."""
