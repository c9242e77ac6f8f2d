"""`campaign run`: the deployed fleets reached through Fargate tasks inside the VPC (ECS RunTask,
or local processes offline).
"""
