"""The course: the lecture's three demos and the two-hour lab with its checks and grader.
"""
