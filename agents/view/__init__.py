"""The twin explorer: ``twice view`` renders records, runs and audits as one self-contained HTML file."""
