"""servelab: reproducible, blog-quality benchmarks of self-hosted LLM servers."""

__version__ = "0.1.0"
