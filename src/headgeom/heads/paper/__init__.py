"""The paper's model selections, tables and figures."""
