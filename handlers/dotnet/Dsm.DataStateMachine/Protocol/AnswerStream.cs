// Answers on their way to stdout: whole lines, flushed once per burst of requests read.

using System;
using System.IO;

namespace Dsm.DataStateMachine.Protocol
{
    /// <summary>Answers on their way to stdout: whole lines only, flushed once per batch of requests.</summary>
    internal sealed class AnswerStream
    {
        private readonly Stream output;
        private readonly object gate = new object();
        private byte[] buffer = new byte[1 << 16];
        private int length;
        private bool batching;

        public AnswerStream(Stream output)
        {
            this.output = output;
        }

        /// <summary>Answers written until <see cref="EndBatch"/> wait there, so a burst goes out in one write.</summary>
        public void BeginBatch()
        {
            lock (gate) batching = true;
        }

        public void EndBatch()
        {
            lock (gate)
            {
                batching = false;
                FlushLocked();
            }
        }

        /// <summary>Queues one answer line (ASCII); sent now unless a batch is being read.</summary>
        public void Write(string line)
        {
            lock (gate)
            {
                if (length + line.Length > buffer.Length)
                {
                    FlushLocked();
                    if (line.Length > buffer.Length) Array.Resize(ref buffer, line.Length);
                }
                for (int i = 0; i < line.Length; i++) buffer[length + i] = (byte)line[i];
                length += line.Length;
                if (!batching) FlushLocked();
            }
        }

        public void Flush()
        {
            lock (gate) FlushLocked();
        }

        private void FlushLocked()
        {
            if (length == 0) return;
            output.Write(buffer, 0, length);
            output.Flush();
            length = 0;
        }
    }
}
