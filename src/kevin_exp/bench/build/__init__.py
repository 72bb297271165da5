"""Fast, cached builds of candidates' ``load_inline`` extensions (the builder: ``builder.Builder``).

Nothing is re-exported here, so importing one part of the build (``from kevin_exp.bench.build import proc``)
does not import the builder and everything it reaches.
"""
