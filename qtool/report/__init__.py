"""The offline HTML report: its data and its page."""
