"""`campaign local`: emulators or vLLM CPU engines, Prometheus and Locust as processes on this
machine.
"""
