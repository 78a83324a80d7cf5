// The protocol host: a handler class, verified as it is, with one line in a Main.
//
//   static int Main(string[] args) =>
//       DsmProtocolHost.Run(args, clock => new MyHandler(clock));
//
// It speaks docs/protocol.md on stdin/stdout: framing, pipelining, ids, open and close in
// order with everything else, named stores and peers, the mapping of the named exceptions to
// error kinds, instants to the microsecond and the year-9999 limit. The handler sees only
// its own contract: IDataStateMachineHandler, a StateHandlerContext, a clock.

using System;
using System.IO;
using System.Text;
using System.Threading;
using System.Threading.Tasks;
using Newtonsoft.Json;

namespace Dsm.DataStateMachine.Protocol
{
    public static class DsmProtocolHost
    {
        /// <summary>The protocol version this host speaks.</summary>
        public const int ProtocolVersion = 1;

        /// <summary>
        /// Serves a handler whose store lives in the process (or is named by its own
        /// configuration): each process the harness starts is one store.
        /// </summary>
        public static int Run(string[] args, Func<IClock, IDataStateMachineHandler> factory, HostOptions options = null)
        {
            if (factory == null) throw new ArgumentNullException("factory");
            return Serve(args, options, (clock, store) => factory(clock), false);
        }

        /// <summary>
        /// Serves a handler that can work in a store the harness names on <c>open</c> (a
        /// file, a schema, a key prefix): <paramref name="factory"/> gets the name, or
        /// <c>null</c> when none is named. Every process opened with the same name must reach
        /// the same records; the harness then races its workers through several processes.
        /// </summary>
        public static int Run(string[] args, Func<IClock, string, IDataStateMachineHandler> factory, HostOptions options = null)
        {
            if (factory == null) throw new ArgumentNullException("factory");
            return Serve(args, options, factory, true);
        }

        private static int Serve(string[] args, HostOptions options, Func<IClock, string, IDataStateMachineHandler> factory, bool namedStores)
        {
            options = options ?? new HostOptions();
            foreach (var arg in args ?? new string[0])
            {
                if (arg == "--serial") options.Concurrent = false;
            }
            var answers = new AnswerStream(Console.OpenStandardOutput());
            var session = new HostSession(factory, namedStores, options, answers);
            return Pump(Console.OpenStandardInput(), session, answers);
        }

        /// <summary>
        /// Reads whatever the pipe holds, answers every complete line in it, then writes the
        /// answers in one go: a burst of pipelined requests costs one read and one write.
        /// </summary>
        private static int Pump(Stream input, HostSession session, AnswerStream answers)
        {
            var chunk = new byte[1 << 16];
            var partial = new MemoryStream();
            while (!session.Closed)
            {
                int read = input.Read(chunk, 0, chunk.Length);
                if (read <= 0) break;
                answers.BeginBatch();
                try
                {
                    int start = 0;
                    for (int i = 0; i < read && !session.Closed; i++)
                    {
                        if (chunk[i] != (byte)'\n') continue;
                        string line;
                        if (partial.Length == 0)
                        {
                            line = Encoding.UTF8.GetString(chunk, start, i - start);
                        }
                        else
                        {
                            partial.Write(chunk, start, i - start);
                            line = Encoding.UTF8.GetString(partial.GetBuffer(), 0, (int)partial.Length);
                            partial.SetLength(0);
                        }
                        start = i + 1;
                        session.HandleLine(line);
                    }
                    if (!session.Closed && start < read) partial.Write(chunk, start, read - start);
                }
                finally
                {
                    answers.EndBatch();
                }
            }
            if (!session.Closed) session.EndOfInput();
            answers.Flush();
            return 0;
        }
    }

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

    /// <summary>One protocol session: an <c>open</c>, the requests, a <c>close</c>.</summary>
    internal sealed class HostSession
    {
        private readonly Func<IClock, string, IDataStateMachineHandler> factory;
        private readonly bool namedStores;
        private readonly HostOptions options;
        private readonly AnswerStream answers;
        private readonly RequestClock clock = new RequestClock();
        private readonly CancellationTokenSource stopping = new CancellationTokenSource();
        private readonly object flight = new object();
        private int inFlight;
        private IDataStateMachineHandler handler;

        public HostSession(Func<IClock, string, IDataStateMachineHandler> factory, bool namedStores, HostOptions options, AnswerStream answers)
        {
            this.factory = factory;
            this.namedStores = namedStores;
            this.options = options;
            this.answers = answers;
        }

        public bool Closed { get; private set; }

        private string Name
        {
            get { return string.IsNullOrEmpty(options.Name) ? "dsm host" : options.Name; }
        }

        public void HandleLine(string line)
        {
            if (line.Trim().Length == 0) return;
            ProtocolRequest request;
            try
            {
                request = ProtocolRequest.Parse(line);
            }
            catch (Exception error) when (error is JsonException || error is OverflowException || error is InvalidCastException)
            {
                Log("a request is not JSON (" + error.Message + "); ignored: " + Shorten(line));
                return;
            }
            if (!request.HasId)
            {
                Log("a request without a positive integer id; ignored: " + Shorten(line));
                return;
            }
            if (request.Problem != null)
            {
                Refuse(request.Id, new BadRequestException(request.Problem));
                return;
            }
            if (request.Op == "open")
            {
                Open(request);
                return;
            }
            if (request.Op == "close")
            {
                Close(request);
                return;
            }
            if (handler == null)
            {
                Refuse(request.Id, new BadRequestException(request.Op + " before open"));
                return;
            }
            Dispatch(request);
            if (!options.Concurrent) WaitForRequestsInFlight();
        }

        /// <summary>Stdin ended without a close: finish what is in flight and release the store (it is kept).</summary>
        public void EndOfInput()
        {
            WaitForRequestsInFlight();
            stopping.Cancel();
            if (handler == null) return;
            try
            {
                Release(false);
            }
            catch (Exception error)
            {
                Log("closing the handler at the end of input failed: " + Answers.Unwrap(error));
            }
        }

        // --- open and close -------------------------------------------------------------------

        private void Open(ProtocolRequest request)
        {
            if (handler != null)
            {
                Refuse(request.Id, new BadRequestException("open was already answered; one open per process"));
                return;
            }
            bool named = namedStores && request.Store != null;
            var hello = Answers.Begin(request.Id, false);
            hello.Append("{\"protocol\":").Append(DsmProtocolHost.ProtocolVersion);
            hello.Append(",\"concurrent\":").Append(options.Concurrent ? "true" : "false");
            hello.Append(",\"name\":");
            Answers.String(hello, Name);
            hello.Append(",\"shared_store\":").Append(options.SharedStore && request.Store == null ? "true" : "false");
            hello.Append(",\"named_store\":").Append(named ? "true" : "false");
            hello.Append('}');
            if (request.ProtocolVersion != DsmProtocolHost.ProtocolVersion)
            {
                // Another version: say ours and open nothing; the harness stops with VersionMismatchError.
                answers.Write(Answers.End(hello));
                return;
            }
            clock.Serve(request.Now);
            try
            {
                var made = factory(clock, named ? request.Store : null);
                if (made == null)
                {
                    throw new FactoryException("given to DsmProtocolHost.Run", "returned null", "return a handler for the clock it is given");
                }
                var lifecycle = made as IStoreLifecycle;
                if (lifecycle != null) lifecycle.OpenAsync(stopping.Token).GetAwaiter().GetResult();
                handler = made;
            }
            catch (Exception error)
            {
                Log("open failed: " + Answers.Unwrap(error));
                Refuse(request.Id, error);
                return;
            }
            answers.Write(Answers.End(hello));
        }

        private void Close(ProtocolRequest request)
        {
            // Everything sent before close is answered before it.
            WaitForRequestsInFlight();
            Closed = true;
            try
            {
                if (handler != null) Release(request.DropStore);
            }
            catch (Exception error)
            {
                Refuse(request.Id, error);
                return;
            }
            var line = Answers.Begin(request.Id, false);
            line.Append("null");
            answers.Write(Answers.End(line));
        }

        private void Release(bool dropStore)
        {
            var closing = handler;
            handler = null;
            var lifecycle = closing as IStoreLifecycle;
            if (lifecycle != null)
            {
                lifecycle.CloseAsync(dropStore, CancellationToken.None).GetAwaiter().GetResult();
                return;
            }
            var disposable = closing as IDisposable;
            if (disposable != null) disposable.Dispose();
        }

        // --- the operations -------------------------------------------------------------------

        private void Dispatch(ProtocolRequest request)
        {
            var ctx = request.Context;
            var token = stopping.Token;
            try
            {
                CheckInstants(request);
                clock.Serve(request.Now);
                switch (request.Op)
                {
                    case "exists":
                        Complete(request.Id, handler.ExistsAsync(ctx, token), (into, found) => into.Append(found ? "true" : "false"));
                        break;
                    case "get":
                        Complete(request.Id, handler.GetAsync(ctx, token), Answers.Record);
                        break;
                    case "try_acquire_lock":
                        Complete(request.Id, handler.TryAcquireLockAsync(ctx, token), Answers.Number);
                        break;
                    case "set":
                        Complete(request.Id, handler.SetAsync(ctx, request.Status, request.Data, token));
                        break;
                    case "release_lock_as_failed":
                        Complete(request.Id, handler.ReleaseLockAsFailedAsync(ctx, request.ErrorDetail, token));
                        break;
                    case "upsert":
                        Complete(request.Id, handler.UpsertAsync(ctx, request.Data, token));
                        break;
                    case "reset_expired_locks":
                        Complete(request.Id, handler.ResetExpiredLocksAsync(token), (into, count) => Answers.Number(into, count));
                        break;
                    case "expire_past_retention":
                        Complete(request.Id, handler.ExpirePastRetentionAsync(token), (into, count) => Answers.Number(into, count));
                        break;
                }
            }
            catch (Exception error)
            {
                // Thrown before the method returned its task: answered the same way.
                Refuse(request.Id, error);
            }
        }

        /// <summary>
        /// The year-9999 limit, checked where the reference model checks it: after the errors
        /// that come first (an unsupported status, a payload over the limit, a release without
        /// a token, which the handler answers), before anything else. A handler never sees an
        /// instant it could not add its lock duration or retention to.
        /// </summary>
        private static void CheckInstants(ProtocolRequest request)
        {
            var config = request.Context == null ? null : request.Context.HandlerConfig;
            switch (request.Op)
            {
                case "try_acquire_lock":
                    config.LockedUntil(request.Now);
                    config.RetainUntil(request.Now);
                    break;
                case "set":
                    if (Statuses.Settable.Contains(request.Status) && WithinLimit(request.Data)) config.RetainUntil(request.Now);
                    break;
                case "release_lock_as_failed":
                    if (request.Context.LockToken.HasValue) config.RetainUntil(request.Now);
                    break;
                case "upsert":
                    if (WithinLimit(request.Data)) config.RetainUntil(request.Now);
                    break;
            }
        }

        private static bool WithinLimit(string data)
        {
            return data == null || data.Length * 3L <= Handlers.Lifecycle.MaxDataBytes
                || Encoding.UTF8.GetByteCount(data) <= Handlers.Lifecycle.MaxDataBytes;
        }

        private void Complete<T>(long id, Task<T> task, Action<StringBuilder, T> result)
        {
            if (task.IsCompleted)
            {
                Answer(id, task, result);
                return;
            }
            lock (flight) inFlight++;
            task.ContinueWith(
                done =>
                {
                    try
                    {
                        Answer(id, done, result);
                    }
                    finally
                    {
                        Landed();
                    }
                },
                CancellationToken.None, TaskContinuationOptions.ExecuteSynchronously, TaskScheduler.Default);
        }

        private void Complete(long id, Task task)
        {
            if (task.IsCompleted)
            {
                Answer(id, task);
                return;
            }
            lock (flight) inFlight++;
            task.ContinueWith(
                done =>
                {
                    try
                    {
                        Answer(id, done);
                    }
                    finally
                    {
                        Landed();
                    }
                },
                CancellationToken.None, TaskContinuationOptions.ExecuteSynchronously, TaskScheduler.Default);
        }

        private void Answer(long id, Task task)
        {
            if (Failed(id, task)) return;
            var line = Answers.Begin(id, false);
            line.Append("null");
            answers.Write(Answers.End(line));
        }

        private void Answer<T>(long id, Task<T> task, Action<StringBuilder, T> result)
        {
            if (Failed(id, task)) return;
            var line = Answers.Begin(id, false);
            result(line, task.Result);
            answers.Write(Answers.End(line));
        }

        /// <summary>Answers a task that failed or was cancelled with its error; false when it succeeded.</summary>
        private bool Failed(long id, Task task)
        {
            if (task.IsFaulted)
            {
                Refuse(id, task.Exception);
                return true;
            }
            if (task.IsCanceled)
            {
                Refuse(id, new OperationCanceledException("the handler's task was cancelled"));
                return true;
            }
            return false;
        }

        private void Refuse(long id, Exception error)
        {
            var line = Answers.Begin(id, true);
            Answers.Error(line, error);
            answers.Write(Answers.End(line));
        }

        private void Landed()
        {
            lock (flight)
            {
                inFlight--;
                if (inFlight == 0) Monitor.PulseAll(flight);
            }
        }

        private void WaitForRequestsInFlight()
        {
            lock (flight)
            {
                while (inFlight > 0) Monitor.Wait(flight);
            }
        }

        private void Log(string message)
        {
            Console.Error.WriteLine(Name + ": " + message);
        }

        private static string Shorten(string line)
        {
            return line.Length <= 120 ? line : line.Substring(0, 120) + "... (" + line.Length + " characters)";
        }
    }
}
