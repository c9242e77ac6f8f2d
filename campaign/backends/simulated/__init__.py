"""`campaign plan`'s fleets: the replay and every capacity step through the emulator's engine in
simulated time.
"""
