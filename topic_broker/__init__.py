"""Topic brokers: managed ledgers, cursors, topics and partitions, ownership (planned; see the issues)."""
