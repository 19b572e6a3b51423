"""Results across tools and time: other tools' result files imported as run folders with their
figures beside servelab's recomputation (`formats`, `importer`, `export` for round trips), two runs
or studies compared under the verdicts (`compare`), and the pages of both (`pages`)."""
