"""Plain-Python training side: environments, reward components, stats, TRL job runners, recorder.

Never imports Django: `workers/` is the only glue between this package and the web application.
"""
