"""Where the fleets serve and how load reaches them, behind the stages' seams: local processes
(local), the emulator in simulated time (simulated), Fargate tasks against the deployed stack
(fargate).
"""
