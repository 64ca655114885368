"""Gradio and plotting pieces of the app: each module turns trace records into one panel."""
