"""servelab: reproducible, blog-quality benchmarks of self-hosted LLM servers."""

__version__ = "0.2.0"  # as pyproject.toml
