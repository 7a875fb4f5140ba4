# ddpq on a GPU host. The NVIDIA driver (libnvidia-ml) comes from the host through the
# NVIDIA container toolkit; torch's CUDA build brings the rest.
FROM python:3.11-slim
WORKDIR /opt/ddpq
COPY pyproject.toml README.md alembic.ini ./
COPY src ./src
COPY migrations ./migrations
RUN pip install --no-cache-dir '.[train]'
ENV DDPQ_HOME=/var/lib/ddpq
EXPOSE 8765
ENTRYPOINT ["ddpq"]
CMD ["serve", "--host", "0.0.0.0", "--auth"]
